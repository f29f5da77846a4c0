//! The fake driver root and device root of one mock node (what `tessera-fake-driver-root`
//! writes).
//!
//! Driver root, laid out like a real install (`--layout host`: a host install at `/` or the GPU
//! operator's `/run/nvidia/driver`; `--layout gke`: GKE's `/home/kubernetes/bin/nvidia`):
//!
//! | | host | gke |
//! |---|---|---|
//! | libraries | `usr/lib/<multiarch>/` (`vdpau/` for VDPAU) | `lib64/` (and `lib -> lib64`) |
//! | binaries | `usr/bin/` | `bin/` |
//! | firmware | `lib/firmware/nvidia/<version>/` | `firmware/nvidia/<version>/` |
//! | loader cache | `etc/ld.so.cache` | none (found by search path) |
//!
//! Each library is `<name>.so.<driver version>`, with the links a real install has:
//! `<soname> -> <file>` and `<name>.so -> <soname>`. `libnvidia-ml` is a copy of fake-nvml
//! carrying this node's topology (with the node's UUIDs) and device root, `libcuda` is fake-cuda,
//! the others are copies of the empty stand-in library (tessera-fake-driver-stub) with their real
//! soname. The binaries are one copy of the multi-call stand-in (`tessera-fake-driver-tool`),
//! hard-linked under each name. The driver version is the topology's
//! `driverVersion`.
//!
//! Device root: `dev/nvidia<minor>` per GPU, `dev/nvidiactl`, `dev/nvidia-uvm`,
//! `dev/nvidia-uvm-tools`, `dev/nvidia-caps/nvidia-cap{1,2}`, for MIG-capable GPUs every
//! capability minor of the standard layout and, on a node with NVLink fabric, the IMEX channels
//! `dev/nvidia-caps-imex-channels/channel0..127`. They are character devices with `/dev/null`'s
//! numbers (1:3), so a container that gets them through CDI can open them, with the modes a real
//! node has (survey of an H100 node: 0666, capabilities 0400 config / 0444 others).
//!
//! Every file is written to a temporary name and renamed, so rewriting a root that running
//! containers have bind-mounted leaves their files intact.

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tessera_driver_root::devices::{
    self, MIG_CONFIG_CAP_MINOR, MIG_MONITOR_CAP_MINOR, standard_mig_cap_minors,
};
use tessera_driver_root::ldcache::{Entry, LdCache};
use tessera_fake_nvml::embedded::{self, DriverData};
use tessera_gpu_inventory::GpuInventory;

use crate::stub;

/// Where a driver install keeps its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A host install or the GPU operator's driver container: `usr/lib/<multiarch>`, `usr/bin`,
    /// `lib/firmware`, `etc/ld.so.cache`.
    Host,
    /// GKE's: `lib64`, `bin`, `firmware`, no loader cache.
    Gke,
}

/// The Debian multiarch directory name of this build's architecture.
pub fn multiarch_triplet() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "aarch64-linux-gnu"
    } else {
        "x86_64-linux-gnu"
    }
}

impl Layout {
    /// The library directory, relative to the root.
    pub fn library_dir(self) -> PathBuf {
        match self {
            Layout::Host => Path::new("usr/lib").join(multiarch_triplet()),
            Layout::Gke => PathBuf::from("lib64"),
        }
    }

    /// The binary directory, relative to the root.
    pub fn binary_dir(self) -> PathBuf {
        match self {
            Layout::Host => PathBuf::from("usr/bin"),
            Layout::Gke => PathBuf::from("bin"),
        }
    }

    /// The firmware directory of driver `version`, relative to the root.
    pub fn firmware_dir(self, version: &str) -> PathBuf {
        let base = match self {
            Layout::Host => "lib/firmware",
            Layout::Gke => "firmware",
        };
        Path::new(base).join("nvidia").join(version)
    }
}

/// Which built file a library copies. Every copy gets its soname written over the placeholder
/// soname the three are linked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Artifact {
    /// `libtessera_fake_nvml.so`, also patched with the node's data.
    FakeNvml,
    /// `libtessera_fake_cuda.so`.
    FakeCuda,
    /// `libtessera_fake_driver_stub.so`, the stand-in without behaviour.
    Stub,
}

/// A driver library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibrarySpec {
    /// File name up to `.so`, e.g. `libcuda`.
    pub stem: &'static str,
    /// The soname's suffix after `.so.`; `None` when the soname is the versioned file name.
    pub soname_major: Option<&'static str>,
    pub artifact: Artifact,
    /// A VDPAU driver: in the `vdpau/` subdirectory of a host install.
    pub vdpau: bool,
}

const fn lib(stem: &'static str, soname_major: Option<&'static str>) -> LibrarySpec {
    LibrarySpec {
        stem,
        soname_major,
        artifact: Artifact::Stub,
        vdpau: false,
    }
}

/// The libraries of a driver install: the ones NVIDIA's container toolkit injects (every
/// `lib*.so.<driver version>` the loader cache lists, plus VDPAU), with the sonames of the
/// surveyed 580 driver.
pub const LIBRARIES: &[LibrarySpec] = &[
    LibrarySpec {
        artifact: Artifact::FakeCuda,
        ..lib("libcuda", Some("1"))
    },
    LibrarySpec {
        artifact: Artifact::FakeNvml,
        ..lib("libnvidia-ml", Some("1"))
    },
    lib("libcudadebugger", Some("1")),
    lib("libnvidia-ptxjitcompiler", Some("1")),
    lib("libnvidia-nvvm", Some("4")),
    lib("libnvidia-cfg", Some("1")),
    lib("libnvidia-opencl", Some("1")),
    lib("libnvidia-gpucomp", None),
    lib("libnvidia-allocator", Some("1")),
    lib("libnvidia-pkcs11-openssl3", None),
    lib("libnvidia-tls", None),
    lib("libnvidia-glcore", None),
    lib("libnvidia-glsi", None),
    lib("libnvidia-glvkspirv", None),
    lib("libnvidia-eglcore", None),
    lib("libnvidia-rtcore", None),
    lib("libnvidia-encode", Some("1")),
    lib("libnvidia-fbc", Some("1")),
    lib("libnvidia-opticalflow", Some("1")),
    lib("libnvcuvid", Some("1")),
    lib("libnvoptix", Some("1")),
    lib("libGLX_nvidia", Some("0")),
    lib("libEGL_nvidia", Some("0")),
    lib("libGLESv2_nvidia", Some("2")),
    lib("libGLESv1_CM_nvidia", Some("1")),
    LibrarySpec {
        vdpau: true,
        ..lib("libvdpau_nvidia", Some("1"))
    },
];

/// The driver's executables every node has (the toolkit's list, less the IMEX programs).
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// The IMEX package's programs, on nodes whose GPUs are on a multi-node NVLink fabric only.
pub const IMEX_BINARIES: &[&str] = &["nvidia-imex", "nvidia-imex-ctl"];

/// IMEX channel device nodes a fabric node's device root has
/// (`dev/nvidia-caps-imex-channels/channel0..`): as many as Tessera publishes per clique by
/// default.
pub const IMEX_CHANNELS: u32 = 128;

/// Whether a node's GPUs are on a multi-node NVLink fabric (it gets the IMEX programs and
/// channels).
pub fn has_fabric(inventory: &GpuInventory) -> bool {
    inventory.gpus.iter().any(|g| g.fabric.is_some())
}

/// GSP firmware files.
pub const FIRMWARE: &[&str] = &["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// The file the tool writes at the top of a driver root, describing it.
pub const MARKER_FILE: &str = "tessera-fake-driver.json";

impl LibrarySpec {
    /// `<stem>.so.<version>`.
    pub fn file_name(&self, version: &str) -> String {
        format!("{}.so.{version}", self.stem)
    }

    /// The soname.
    pub fn soname(&self, version: &str) -> String {
        match self.soname_major {
            Some(major) => format!("{}.so.{major}", self.stem),
            None => self.file_name(version),
        }
    }

    /// `<stem>.so`, the link development tools use.
    pub fn dev_link(&self) -> String {
        format!("{}.so", self.stem)
    }

    /// The directory of the library, relative to the root.
    pub fn dir(&self, layout: Layout) -> PathBuf {
        let dir = layout.library_dir();
        if self.vdpau && layout == Layout::Host {
            dir.join("vdpau")
        } else {
            dir
        }
    }
}

/// The built files the tool copies.
#[derive(Debug, Clone)]
pub struct Artifacts {
    dir: PathBuf,
    tool: PathBuf,
}

/// The multi-call stand-in binary.
pub const TOOL_BINARY: &str = "tessera-fake-driver-tool";
/// The stand-in library.
pub const STUB_LIBRARY: &str = "libtessera_fake_driver_stub.so";

impl Artifacts {
    /// The files cargo built into `dir` (`target/<profile>`; libraries built as dependencies are
    /// found in its `deps/` too).
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Artifacts {
            tool: dir.join(TOOL_BINARY),
            dir,
        }
    }

    /// For a test executable that also plays the stand-in binary
    /// ([`crate::tool::main_if_named`]): the files cargo built next to it (it runs from
    /// `target/<profile>/deps/`), with the executable itself as the tool.
    pub fn of_test_executable() -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let profile_dir = exe.parent().and_then(Path::parent).ok_or_else(|| {
            std::io::Error::other(format!(
                "{} is not under target/<profile>/deps",
                exe.display()
            ))
        })?;
        Ok(Artifacts::in_dir(profile_dir).with_tool(exe.clone()))
    }

    /// Uses `tool` as the multi-call stand-in binary (tests use their own executable).
    pub fn with_tool(mut self, tool: impl Into<PathBuf>) -> Self {
        self.tool = tool.into();
        self
    }

    fn path(&self, artifact: Artifact) -> PathBuf {
        let name = match artifact {
            Artifact::FakeNvml => tessera_fake_nvml::LIBRARY_FILE_NAME,
            Artifact::FakeCuda => tessera_fake_cuda::LIBRARY_FILE_NAME,
            Artifact::Stub => STUB_LIBRARY,
        };
        // Cargo leaves a library built as a dependency in deps/ and one built on its own in the
        // directory itself; the newer is the current build.
        let candidates = [self.dir.join(name), self.dir.join("deps").join(name)];
        let modified = |p: &PathBuf| fs::metadata(p).and_then(|m| m.modified()).ok();
        candidates
            .iter()
            .filter(|p| p.is_file())
            .max_by_key(|p| modified(p))
            .unwrap_or(&candidates[0])
            .clone()
    }

    /// Fails with the command that builds them when any is missing.
    pub fn check(&self) -> Result<(), LayoutError> {
        let all = [
            self.path(Artifact::FakeNvml),
            self.path(Artifact::FakeCuda),
            self.path(Artifact::Stub),
            self.tool.clone(),
        ];
        match all.into_iter().find(|p| !p.is_file()) {
            Some(missing) => Err(LayoutError::MissingArtifact(missing)),
            None => Ok(()),
        }
    }
}

/// What the tool wrote, printed as JSON for scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node_name: String,
    pub driver_root: PathBuf,
    pub dev_root: PathBuf,
    pub layout: Layout,
    pub driver_version: String,
    /// Absolute paths inside the driver root's own view (`/usr/lib/x86_64-linux-gnu`).
    pub library_dir: PathBuf,
    pub binary_dir: PathBuf,
    pub gpus: Vec<String>,
}

/// Writing the roots failed.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "{} is missing; build the fake driver first: cargo build -p tessera-fake-driver (which \
         builds the libraries it copies too), and pass cargo's target/<profile> as --artifacts",
        .0.display()
    )]
    MissingArtifact(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot embed the node's data in libnvidia-ml: {0}")]
    Embed(#[from] embedded::PatchError),
    #[error("cannot set the soname of {file}: {source}")]
    Soname {
        file: String,
        source: stub::SonameError,
    },
    #[error("cannot encode the topology: {0}")]
    Topology(#[from] serde_yaml::Error),
    #[error(
        "cannot create device node {}: {source}; creating character devices needs root \
         (CAP_MKNOD); --no-mknod writes regular files instead, which only tests without a \
         container runtime accept",
        path.display()
    )]
    Mknod { path: PathBuf, source: io::Error },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn temp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes `bytes` to `path` with `mode`, through a temporary file and a rename.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), LayoutError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    let temp = temp_name(path);
    fs::write(&temp, bytes).map_err(io_error(&temp))?;
    fs::set_permissions(&temp, fs::Permissions::from_mode(mode)).map_err(io_error(&temp))?;
    fs::rename(&temp, path).map_err(io_error(path))
}

/// Makes `path` a symlink to `target`, replacing what is there.
fn write_symlink(path: &Path, target: &str) -> Result<(), LayoutError> {
    let temp = temp_name(path);
    let _ = fs::remove_file(&temp);
    symlink(target, &temp).map_err(io_error(&temp))?;
    fs::rename(&temp, path).map_err(io_error(path))
}

fn read(path: &Path) -> Result<Vec<u8>, LayoutError> {
    fs::read(path).map_err(io_error(path))
}

/// `/` + a root-relative path: the path as the root itself (or a container) sees it.
fn in_root(relative: &Path) -> String {
    format!("/{}", relative.display())
}

/// Writes every library of [`LIBRARIES`] (fake-nvml with `data` embedded, each with its soname)
/// and their symlinks; returns the loader-cache entries that name them.
fn write_libraries(
    root: &Path,
    layout: Layout,
    version: &str,
    data: &DriverData,
    artifacts: &Artifacts,
) -> Result<Vec<Entry>, LayoutError> {
    let mut cache_entries = Vec::new();
    for library in LIBRARIES {
        let dir = library.dir(layout);
        let file = library.file_name(version);
        let mut bytes = read(&artifacts.path(library.artifact))?;
        if library.artifact == Artifact::FakeNvml {
            embedded::patch(&mut bytes, data)?;
        }
        stub::patch_soname(&mut bytes, &library.soname(version)).map_err(|source| {
            LayoutError::Soname {
                file: file.clone(),
                source,
            }
        })?;
        write_file(&root.join(&dir).join(&file), &bytes, 0o755)?;
        let soname = library.soname(version);
        if soname != file {
            write_symlink(&root.join(&dir).join(&soname), &file)?;
        }
        write_symlink(&root.join(&dir).join(library.dev_link()), &soname)?;
        if !library.vdpau || layout != Layout::Host {
            for name in [&soname, &library.dev_link()] {
                cache_entries.push(Entry::native(name.as_str(), in_root(&dir.join(name))));
            }
        }
    }
    Ok(cache_entries)
}

/// Writes the stand-in tool once under `bin_dir` and hard-links it under every other binary's
/// name: it acts on the name it runs under.
fn write_binaries(bin_dir: &Path, tool: &[u8], names: &[&str]) -> Result<(), LayoutError> {
    let first = bin_dir.join(names[0]);
    write_file(&first, tool, 0o755)?;
    for binary in &names[1..] {
        let path = bin_dir.join(binary);
        let temp = temp_name(&path);
        let _ = fs::remove_file(&temp);
        fs::hard_link(&first, &temp).map_err(io_error(&temp))?;
        fs::rename(&temp, &path).map_err(io_error(&path))?;
    }
    Ok(())
}

/// Writes the driver root for a node with `inventory` (the node's, with its UUIDs) whose
/// stand-in device nodes are under `dev_root`.
pub fn write_driver_root(
    root: &Path,
    layout: Layout,
    node_name: &str,
    inventory: &GpuInventory,
    dev_root: &Path,
    artifacts: &Artifacts,
) -> Result<Summary, LayoutError> {
    artifacts.check()?;
    let version = inventory.driver_version.clone();
    let data = DriverData {
        topology: serde_yaml::to_string(inventory)?,
        dev_root: Some(dev_root.to_path_buf()),
    };
    let cache_entries = write_libraries(root, layout, &version, &data, artifacts)?;
    let mut binaries = BINARIES.to_vec();
    if has_fabric(inventory) {
        binaries.extend(IMEX_BINARIES);
    }
    write_binaries(
        &root.join(layout.binary_dir()),
        &read(&artifacts.tool)?,
        &binaries,
    )?;
    for firmware in FIRMWARE {
        write_file(
            &root.join(layout.firmware_dir(&version)).join(firmware),
            b"stand-in GSP firmware (tessera-fake-driver)\n",
            0o644,
        )?;
    }
    match layout {
        Layout::Host => {
            let cache = LdCache {
                entries: cache_entries,
                ..LdCache::default()
            };
            write_file(&root.join("etc/ld.so.cache"), &cache.to_bytes(), 0o644)?;
        }
        Layout::Gke => write_symlink(&root.join("lib"), "lib64")?,
    }
    let summary = Summary {
        node_name: node_name.to_owned(),
        driver_root: root.to_path_buf(),
        dev_root: dev_root.to_path_buf(),
        layout,
        driver_version: version,
        library_dir: PathBuf::from(in_root(&layout.library_dir())),
        binary_dir: PathBuf::from(in_root(&layout.binary_dir())),
        gpus: inventory.gpus.iter().map(|g| g.uuid.clone()).collect(),
    };
    let json = serde_json::to_vec_pretty(&summary).unwrap_or_default();
    write_file(&root.join(MARKER_FILE), &json, 0o644)?;
    Ok(summary)
}

/// How device nodes are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Character devices with `/dev/null`'s numbers (needs CAP_MKNOD).
    CharDevice,
    /// Empty regular files (for tests without privileges and without a container runtime).
    RegularFile,
}

/// The device nodes of a node with `inventory`, as `(path under the dev root, mode)`.
pub fn device_nodes(inventory: &GpuInventory) -> Vec<(String, u32)> {
    let mut nodes: Vec<(String, u32)> = inventory
        .gpus
        .iter()
        .map(|gpu| (devices::gpu_node(gpu.minor), 0o666))
        .collect();
    nodes.extend(
        devices::CONTROL_NODES
            .iter()
            .map(|p| ((*p).to_owned(), 0o666)),
    );
    nodes.push((devices::cap_node(MIG_CONFIG_CAP_MINOR), 0o400));
    nodes.push((devices::cap_node(MIG_MONITOR_CAP_MINOR), 0o444));
    for gpu in inventory.gpus.iter().filter(|g| g.mig.is_some()) {
        nodes.extend(standard_mig_cap_minors(gpu.minor).map(|m| (devices::cap_node(m), 0o444)));
    }
    if has_fabric(inventory) {
        nodes.extend(
            (0..IMEX_CHANNELS)
                .map(|n| (format!("/dev/nvidia-caps-imex-channels/channel{n}"), 0o666)),
        );
    }
    nodes
}

/// Writes the stand-in device nodes of `inventory` under `dev_root`. Existing nodes of the right
/// kind are kept.
pub fn write_dev_root(
    dev_root: &Path,
    inventory: &GpuInventory,
    kind: NodeKind,
) -> Result<(), LayoutError> {
    for (node, mode) in device_nodes(inventory) {
        let path = dev_root.join(node.trim_start_matches('/'));
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        let existing = fs::symlink_metadata(&path).ok();
        let done = existing.as_ref().is_some_and(|m| match kind {
            NodeKind::CharDevice => std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()),
            NodeKind::RegularFile => m.is_file(),
        });
        if !done {
            if existing.is_some() {
                fs::remove_file(&path).map_err(io_error(&path))?;
            }
            match kind {
                NodeKind::CharDevice => rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &path,
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_bits_truncate(mode),
                    rustix::fs::makedev(1, 3),
                )
                .map_err(|e| LayoutError::Mknod {
                    path: path.clone(),
                    source: e.into(),
                })?,
                NodeKind::RegularFile => {
                    fs::write(&path, b"").map_err(io_error(&path))?;
                }
            }
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(io_error(&path))?;
    }
    Ok(())
}
