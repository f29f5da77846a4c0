//! The NVIDIA driver root, read at start: at `--driver-root` (which this process sees at
//! `--container-driver-root`) [`load`] reads it with [`tessera_driver_root::discover`], installs
//! its CDI hook on the host, and returns what every claim spec injects
//! ([`DriverInjection`]), and the paths of `nvidia-smi` and `nvidia-cuda-mps-control` with the
//! library path they need, for sharing ([`DriverTools`]).
//!
//! The driver is read once per start: a driver upgrade restarts the plugin (the GPU operator
//! drains the node; a host upgrade reboots it), and the start rewrites the specs of prepared
//! claims whose content changed.

use std::path::{Path, PathBuf};

use tessera_driver_root::discover::{self, DiscoveryError, DriverFiles};
use tessera_driver_root::edits::{self, HOOK_BINARY, Injection};
use tessera_driver_root::tree::HostTree;
use tessera_nvml::DEFAULT_LIBRARY as NVML_LIBRARY;

use tessera_prepare::injection::{DriverInjection, control_nodes};

/// The driver's tools as this process runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverTools {
    pub nvidia_smi: Option<PathBuf>,
    pub mps_control: Option<PathBuf>,
    /// `nvidia-imex` and `nvidia-imex-ctl` (fabric nodes' IMEX daemon and its client).
    pub imex_daemon: Option<PathBuf>,
    pub imex_ctl: Option<PathBuf>,
    /// The driver's library directories as this process sees them (`LD_LIBRARY_PATH` of the
    /// tools: a driver root that is not `/` is not on this process's loader path).
    pub library_path: String,
    /// The driver's `libnvidia-ml.so.1` as this process sees it (a mock node's fake driver root
    /// has one too: the GPU metrics read it).
    pub nvml: Option<PathBuf>,
}

/// Where the driver is, as flags give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRootConfig {
    /// The driver root on the host.
    pub driver_root: PathBuf,
    /// The same directory as this process sees it.
    pub container_driver_root: PathBuf,
    /// The device root on the host, which this process sees at the same path.
    pub dev_root: PathBuf,
    /// The CDI hook.
    pub hook: HookInstall,
}

/// One place the driver may be: the directory on the host (what CDI specs name, since the
/// container runtime resolves them on the host) and where this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRootPath {
    pub host: PathBuf,
    pub container: PathBuf,
}

/// Where the driver may be, as flags give it: one root, or candidates in order of preference
/// (the chart's default: the GPU operator's `/run/nvidia/driver` first, then the host's `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoots {
    /// Never empty; the first complete one is used.
    pub candidates: Vec<DriverRootPath>,
    /// The device root on the host, which this process sees at the same path.
    pub dev_root: PathBuf,
    /// The CDI hook.
    pub hook: HookInstall,
}

/// A candidate that holds a complete driver: which one (its index in
/// [`DriverRoots::candidates`]) and the driver's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteRoot {
    pub index: usize,
    pub version: String,
}

/// No candidate holds a complete driver: each one and what it lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe_lacking(.0))]
pub struct NoCompleteDriver(pub Vec<(PathBuf, String)>);

fn describe_lacking(lacking: &[(PathBuf, String)]) -> String {
    let each = lacking
        .iter()
        .map(|(root, lacks)| format!("{} {lacks}", root.display()))
        .collect::<Vec<_>>()
        .join("; ");
    let which = if lacking.len() == 1 {
        "the driver root"
    } else {
        "any candidate driver root"
    };
    format!(
        "no NVIDIA driver under {which}: {each} (a complete driver has its \
         libcuda.so.<version> or libnvidia-ml.so.<version> in the root's /etc/ld.so.cache or \
         library directories; the chart's nvidiaDriverRoot: empty finds the GPU operator's \
         /run/nvidia/driver or a host install at /; /home/kubernetes/bin/nvidia on GKE)"
    )
}

impl DriverRoots {
    /// Candidate `index` as the one root the plugin uses.
    pub fn config(&self, index: usize) -> DriverRootConfig {
        let root = &self.candidates[index];
        DriverRootConfig {
            driver_root: root.host.clone(),
            container_driver_root: root.container.clone(),
            dev_root: self.dev_root.clone(),
            hook: self.hook.clone(),
        }
    }

    /// The most preferred candidate among the first `before` that holds a complete driver, or
    /// what each of them lacks (blocking: file IO).
    pub fn first_complete(&self, before: usize) -> Result<CompleteRoot, NoCompleteDriver> {
        let mut lacking = Vec::new();
        for (index, root) in self.candidates.iter().enumerate().take(before) {
            match version_at(root) {
                Ok(version) => return Ok(CompleteRoot { index, version }),
                Err(lacks) => lacking.push((root.host.clone(), lacks)),
            }
        }
        Err(NoCompleteDriver(lacking))
    }

    /// [`DriverRoots::first_complete`] among every candidate: the root to start on.
    pub fn choose(&self) -> Result<CompleteRoot, NoCompleteDriver> {
        self.first_complete(self.candidates.len())
    }
}

/// The version of the complete driver under `root`, or what the root lacks.
pub fn version_at(root: &DriverRootPath) -> Result<String, String> {
    let tree = HostTree::new(&root.container);
    match discover::discover(&tree, &root.host.display().to_string()) {
        Ok(files) => Ok(files.version),
        Err(DiscoveryError::NoDriver { .. }) => Err(lacks(&root.container)),
    }
}

/// What a root without a complete driver lacks, by what this process sees at `container`.
fn lacks(container: &Path) -> String {
    match std::fs::read_dir(container).map(|mut entries| entries.next().is_none()) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(error) => format!("cannot be read ({error})"),
        Ok(true) => "is empty".to_owned(),
        Ok(false) => "has no libcuda.so.<version> or libnvidia-ml.so.<version>".to_owned(),
    }
}

/// Where the CDI hook comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookInstall {
    /// Copy `source` (normally next to this program) to `target` on the host (a path this
    /// process sees at the same place).
    Copy { source: PathBuf, target: PathBuf },
    /// Already installed on the host at this path (which this process sees at the same place).
    Installed(PathBuf),
}

impl HookInstall {
    /// The hook's host path.
    pub fn path(&self) -> &Path {
        match self {
            HookInstall::Copy { target, .. } => target,
            HookInstall::Installed(path) => path,
        }
    }
}

/// The driver root cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DriverRootError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(
        "cannot install the CDI hook {} at {}: {source}; containers would not find the driver's \
         libraries without it (the image ships it next to tessera-kubelet-plugin; or install it \
         on the host and pass --cdi-hook-path)",
        source_path.display(), target.display()
    )]
    Hook {
        source_path: PathBuf,
        target: PathBuf,
        source: std::io::Error,
    },
    #[error("--cdi-hook-path {}: {source}", path.display())]
    HookMissing {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What was found, for the start-up log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSummary {
    pub version: String,
    pub libraries: usize,
    pub library_dirs: Vec<PathBuf>,
    pub binaries: Vec<PathBuf>,
    pub firmware: usize,
    pub ipc_sockets: Vec<PathBuf>,
    pub missing_control_nodes: Vec<String>,
    pub hook: PathBuf,
    /// `libnvidia-ml.so.1` as this process sees it (under the container's view of the root),
    /// the NVML backend's library when no --nvml-lib is given.
    pub nvml_library: Option<PathBuf>,
}

/// Copies the hook to the host through a temporary name (a hook that is running keeps its file).
fn install_hook(source: &Path, target: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temp = target.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::copy(source, &temp)?;
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&temp, target)
}

fn tools(files: &DriverFiles, view: &Path) -> DriverTools {
    let seen = |p: &Path| view.join(p.strip_prefix("/").unwrap_or(p));
    DriverTools {
        nvidia_smi: files.binary("nvidia-smi").map(|b| seen(&b.source)),
        mps_control: files
            .binary("nvidia-cuda-mps-control")
            .map(|b| seen(&b.source)),
        imex_daemon: files.binary("nvidia-imex").map(|b| seen(&b.source)),
        imex_ctl: files.binary("nvidia-imex-ctl").map(|b| seen(&b.source)),
        library_path: files
            .library_dirs()
            .iter()
            .map(|d| seen(d).display().to_string())
            .collect::<Vec<_>>()
            .join(":"),
        nvml: files
            .libraries
            .iter()
            .find(|library| library.names().any(|name| name == NVML_LIBRARY))
            .map(|library| seen(&library.path)),
    }
}

/// The NVML library's soname, which programs load.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// Reads the driver root, installs the hook, and returns what specs inject and the tools.
pub fn load(
    config: &DriverRootConfig,
) -> Result<(DriverInjection, DriverTools, DriverSummary), DriverRootError> {
    let tree = HostTree::new(&config.container_driver_root);
    let files = discover::discover(&tree, &config.driver_root.display().to_string())?;
    match &config.hook {
        HookInstall::Copy { source, target } => {
            install_hook(source, target).map_err(|e| DriverRootError::Hook {
                source_path: source.clone(),
                target: target.clone(),
                source: e,
            })?
        }
        HookInstall::Installed(path) => {
            std::fs::metadata(path).map_err(|source| DriverRootError::HookMissing {
                path: path.clone(),
                source,
            })?;
        }
    }
    let injection = Injection {
        driver_root: config.driver_root.clone(),
        dev_root: config.dev_root.clone(),
        hook: Some(config.hook.path().to_path_buf()),
    };
    let (control_nodes, missing_control_nodes) = control_nodes(&config.dev_root);
    let summary = DriverSummary {
        version: files.version.clone(),
        libraries: files.libraries.len(),
        library_dirs: files.library_dirs(),
        binaries: files.binaries.iter().map(|b| b.target.clone()).collect(),
        firmware: files.firmware.len(),
        ipc_sockets: files.ipc_sockets.clone(),
        missing_control_nodes,
        hook: config.hook.path().to_path_buf(),
        nvml_library: files.library_named(NVML_SONAME).map(|path| {
            config
                .container_driver_root
                .join(path.strip_prefix("/").unwrap_or(&path))
        }),
    };
    Ok((
        DriverInjection {
            edits: edits::driver_edits(&files, &injection),
            control_nodes,
            dev_root: config.dev_root.clone(),
        },
        tools(&files, &config.container_driver_root),
        summary,
    ))
}

/// Where the plugin installs its hook: its own directory under the kubelet's plugins directory,
/// which the chart mounts at the same path as on the host.
pub fn default_hook_install(kubelet_plugins_dir: &Path, driver_name: &str) -> PathBuf {
    kubelet_plugins_dir.join(driver_name).join(HOOK_BINARY)
}
