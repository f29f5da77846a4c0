//! What a claim's containers get of the NVIDIA driver, and where the node's driver tools are.
//!
//! At start the plugin reads the driver root (`--driver-root`, seen by this process at
//! `--container-driver-root`) with [`tessera_driver_root::discover`], installs its CDI hook on
//! the host, and keeps the result: the spec-level edits every claim spec carries (the driver's
//! libraries under all their names, binaries, firmware, daemon sockets, the loader-cache hook),
//! the control device nodes that exist under the device root (`--dev-root`), and the paths of
//! `nvidia-smi` and `nvidia-cuda-mps-control` with the library path they need, for sharing.
//!
//! Without a driver root (mock nodes without a fake driver) specs carry the device nodes and
//! environment only, as before ([`DriverInjection::none`]).
//!
//! The driver is read once per start: a driver upgrade restarts the plugin (the GPU operator
//! drains the node; a host upgrade reboots it), and the start rewrites the specs of prepared
//! claims whose content changed.

use std::path::{Path, PathBuf};

use tessera_cdi::{ContainerEdits, DeviceNode};
use tessera_driver_root::devices::CONTROL_NODES;
use tessera_driver_root::discover::{self, DiscoveryError, DriverFiles};
use tessera_driver_root::edits::{self, HOOK_BINARY, Injection};
use tessera_driver_root::tree::HostTree;
use tessera_nvml::DEFAULT_LIBRARY as NVML_LIBRARY;

/// What claim specs inject besides each device's own nodes and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInjection {
    /// Spec-level mounts and hooks (none without a driver root).
    pub edits: ContainerEdits,
    /// The control device nodes every container with a GPU gets.
    pub control_nodes: Vec<DeviceNode>,
    /// The device root on the host (`/` on real nodes).
    pub dev_root: PathBuf,
}

impl Default for DriverInjection {
    fn default() -> Self {
        Self::none()
    }
}

impl DriverInjection {
    /// No driver root: the control nodes by name (the runtime finds them under `/dev`), no
    /// driver files.
    pub fn none() -> Self {
        DriverInjection {
            edits: ContainerEdits::default(),
            control_nodes: CONTROL_NODES
                .iter()
                .map(|p| edits::device_node(p, Path::new("/")))
                .collect(),
            dev_root: PathBuf::from("/"),
        }
    }

    /// No driver root, device nodes under `dev_root`: the control nodes present there (all
    /// three, by name, when it is `/`, as before driver roots existed).
    pub fn devices_only(dev_root: &Path) -> Self {
        if dev_root == Path::new("/") {
            return Self::none();
        }
        DriverInjection {
            edits: ContainerEdits::default(),
            control_nodes: control_nodes(dev_root).0,
            dev_root: dev_root.to_path_buf(),
        }
    }

    /// The device node `path` (e.g. `/dev/nvidia3`) from the device root.
    pub fn device_node(&self, path: &str) -> DeviceNode {
        edits::device_node(path, &self.dev_root)
    }
}

/// The driver's tools as this process runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverTools {
    pub nvidia_smi: Option<PathBuf>,
    pub mps_control: Option<PathBuf>,
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

/// The control nodes present under `dev_root` (this process sees it at that path), and the
/// missing ones.
fn control_nodes(dev_root: &Path) -> (Vec<DeviceNode>, Vec<String>) {
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for node in CONTROL_NODES {
        let seen = dev_root.join(node.trim_start_matches('/'));
        if std::fs::symlink_metadata(&seen).is_ok() {
            present.push(edits::device_node(node, dev_root));
        } else {
            missing.push(seen.display().to_string());
        }
    }
    (present, missing)
}

fn tools(files: &DriverFiles, view: &Path) -> DriverTools {
    let seen = |p: &Path| view.join(p.strip_prefix("/").unwrap_or(p));
    DriverTools {
        nvidia_smi: files.binary("nvidia-smi").map(|b| seen(&b.source)),
        mps_control: files
            .binary("nvidia-cuda-mps-control")
            .map(|b| seen(&b.source)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_root_the_control_nodes_are_named_only() {
        let none = DriverInjection::none();
        assert!(none.edits.is_empty());
        let paths: Vec<&str> = none.control_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, CONTROL_NODES);
        assert!(none.control_nodes.iter().all(|n| n.host_path.is_none()));
        assert_eq!(none.device_node("/dev/nvidia2").host_path, None);
    }

    #[test]
    fn missing_control_nodes_are_left_out_and_reported() {
        let dev_root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dev_root.path().join("dev")).unwrap();
        std::fs::write(dev_root.path().join("dev/nvidiactl"), b"").unwrap();
        let (present, missing) = control_nodes(dev_root.path());
        assert_eq!(present.len(), 1);
        assert_eq!(present[0].path, "/dev/nvidiactl");
        assert_eq!(
            present[0].host_path.as_deref(),
            Some(dev_root.path().join("dev/nvidiactl").to_str().unwrap())
        );
        assert_eq!(missing.len(), 2);
    }
}
