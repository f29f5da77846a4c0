//! Which of the driver's files a container needs, found under a driver root (pure over a
//! [`Tree`]).
//!
//! The rules follow NVIDIA's container toolkit (CDI mode), which is what users compare with:
//!
//! - **Version**: the suffix of `libcuda.so.<version>` (or `libnvidia-ml.so.<version>`), the
//!   file `libcuda.so.1` leads to in the root's loader cache, else in the library search
//!   directories.
//! - **Libraries**: every `lib*.so.<version>` file in a directory that holds one (the "driver
//!   library directories"), and in its `vdpau/` subdirectory; with each its other names in the
//!   same directory (the soname link `libcuda.so.1`, the development link `libcuda.so`), since a
//!   program asks for those. The directories come from the root's `etc/ld.so.cache` when it has
//!   one (a host install, the GPU operator's driver container), else from [`LIBRARY_DIRS`] (GKE's
//!   driver root has no cache).
//! - **Binaries**: [`BINARIES`], the first executable of each name in [`BINARY_DIRS`].
//! - **Firmware**: `nvidia/<version>/gsp*.bin` under [`FIRMWARE_DIRS`] (GSP firmware).
//! - **IPC sockets**: the persistence and fabric manager daemons' sockets, when they exist.
//!
//! Links are followed inside the root (an absolute target is a path in the root). Paths in the
//! result are paths in the root, which are also where the files go in a container.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::ldcache::LdCache;
use crate::tree::{FileKind, Tree, resolve};

/// Where the loader, and the toolkit, look for libraries when the root has no cache.
pub const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/usr/lib",
    "/lib",
];

/// Where the driver's executables are looked for.
pub const BINARY_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
];

/// The driver's executables a container may use (the toolkit's list).
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

/// Firmware directories, the kernel's search order (`updates` first); `/firmware` is GKE's.
pub const FIRMWARE_DIRS: &[&str] = &[
    "/lib/firmware/updates",
    "/lib/firmware",
    "/usr/lib/firmware/updates",
    "/usr/lib/firmware",
    "/firmware",
];

/// Where firmware goes in a container: the kernel's default firmware directory.
pub const FIRMWARE_IN_CONTAINER: &str = "/lib/firmware";

/// The driver daemons' sockets a container may talk to.
pub const IPC_SOCKETS: &[&str] = &[
    "/run/nvidia-persistenced/socket",
    "/var/run/nvidia-persistenced/socket",
    "/run/nvidia-fabricmanager/socket",
    "/var/run/nvidia-fabricmanager/socket",
];

const CACHE: &str = "/etc/ld.so.cache";

/// One driver library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The file, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04`.
    pub path: PathBuf,
    /// Its other names in the same directory, e.g. `libcuda.so.1`, `libcuda.so`.
    pub aliases: Vec<String>,
}

impl Library {
    /// The directory.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }

    /// The file name and every alias.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .into_iter()
            .chain(self.aliases.iter().cloned())
    }
}

/// A file to put into containers: where it is in the root and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The file in the root (links followed).
    pub source: PathBuf,
    /// Its path in a container.
    pub target: PathBuf,
}

/// The driver's files under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFiles {
    /// e.g. `580.159.04`.
    pub version: String,
    /// Where the version was read.
    pub version_from: PathBuf,
    /// The libraries, by directory then name.
    pub libraries: Vec<Library>,
    /// Whether the directories came from the root's loader cache.
    pub from_loader_cache: bool,
    pub binaries: Vec<Placed>,
    pub firmware: Vec<Placed>,
    pub ipc_sockets: Vec<PathBuf>,
}

impl DriverFiles {
    /// The library directories, in order.
    pub fn library_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for library in &self.libraries {
            if !dirs.iter().any(|d| d == library.dir()) {
                dirs.push(library.dir().to_path_buf());
            }
        }
        dirs
    }

    /// The path in the root of the library called `name` (a file name or one of its aliases,
    /// such as the soname `libnvidia-ml.so.1`), if the driver has it.
    pub fn library_named(&self, name: &str) -> Option<PathBuf> {
        self.libraries
            .iter()
            .find(|l| l.names().any(|n| n == name))
            .map(|l| l.dir().join(name))
    }

    /// The binary called `name`, if the driver has it.
    pub fn binary(&self, name: &str) -> Option<&Placed> {
        self.binaries
            .iter()
            .find(|b| b.target.file_name().is_some_and(|n| n == name))
    }
}

/// Why a root holds no usable driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "no NVIDIA driver under {root}: found no libcuda.so.<version> or libnvidia-ml.so.<version> \
         through its {CACHE} or in {dirs}; point --driver-root (chart: kubeletPlugin.driverRoot) \
         at the driver's root: / for a host install, /run/nvidia/driver for the GPU operator, \
         /home/kubernetes/bin/nvidia on GKE",
        dirs = LIBRARY_DIRS.join(", ")
    )]
    NoDriver { root: String },
}

/// Whether `text` is a driver version: numbers separated by dots, at least two.
fn is_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_regular(tree: &dyn Tree, path: &Path) -> bool {
    matches!(tree.kind(path), Some(FileKind::File { .. }))
}

/// The version in `libcuda.so.<version>` / `libnvidia-ml.so.<version>`.
fn version_of(name: &str) -> Option<&str> {
    ["libcuda.so.", "libnvidia-ml.so."]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .filter(|v| is_version(v))
}

/// The 64-bit libraries of the root's loader cache, links resolved: `(name, file)`.
fn cached_libraries(tree: &dyn Tree) -> Option<Vec<(String, PathBuf)>> {
    let bytes = tree.read(Path::new(CACHE)).ok()?;
    let cache = LdCache::parse(&bytes).ok()?;
    Some(
        cache
            .libraries()
            .filter_map(|e| Some((e.name.clone(), resolve(tree, Path::new(&e.path))?)))
            .collect(),
    )
}

/// Regular files named `<prefix><version>` in the search directories: `(dir, version)`.
fn searched_versions(tree: &dyn Tree) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    for dir in LIBRARY_DIRS {
        let Some(dir) = resolve(tree, Path::new(dir)) else {
            continue;
        };
        for name in tree.list(&dir) {
            if let Some(version) = version_of(&name)
                && is_regular(tree, &dir.join(&name))
                && !found.iter().any(|(d, v)| d == &dir && v == version)
            {
                found.push((dir.clone(), version.to_owned()));
            }
        }
    }
    found
}

/// Reads the driver's files under `tree` (`root` names it in errors).
pub fn discover(tree: &dyn Tree, root: &str) -> Result<DriverFiles, DiscoveryError> {
    let cached = cached_libraries(tree);
    let cached_version = cached.as_deref().and_then(version_in_loader_cache);
    let from_loader_cache = cached_version.is_some();
    let searched = if from_loader_cache {
        Vec::new()
    } else {
        searched_versions(tree)
    };
    let Some((version, version_from)) =
        cached_version.or_else(|| version_in_search_dirs(tree, &searched))
    else {
        return Err(DiscoveryError::NoDriver {
            root: root.to_owned(),
        });
    };
    let dirs = if from_loader_cache {
        cached_library_dirs(cached.iter().flatten(), &version)
    } else {
        searched
            .iter()
            .filter(|(_, v)| *v == version)
            .fold(Vec::new(), |dirs, (dir, _)| with_dir(dirs, dir))
    };
    Ok(DriverFiles {
        libraries: libraries_in(tree, &dirs, &version),
        binaries: binaries(tree),
        firmware: firmware(tree, &version),
        ipc_sockets: ipc_sockets(tree),
        version,
        version_from,
        from_loader_cache,
    })
}

/// The version of `libcuda.so.1` (else `libnvidia-ml.so.1`) as the loader cache resolves it,
/// with the file it was read from.
fn version_in_loader_cache(entries: &[(String, PathBuf)]) -> Option<(String, PathBuf)> {
    ["libcuda.so.1", "libnvidia-ml.so.1"]
        .iter()
        .find_map(|soname| {
            let (_, file) = entries.iter().find(|(name, _)| name == soname)?;
            let v = version_of(&file_name(file))?.to_owned();
            Some((v, file.clone()))
        })
}

/// Without a loader cache: of several versions (an upgrade's leftovers) the one `libcuda.so.1`
/// leads to, else the first found.
fn version_in_search_dirs(
    tree: &dyn Tree,
    searched: &[(PathBuf, String)],
) -> Option<(String, PathBuf)> {
    searched
        .iter()
        .find_map(|(dir, v)| {
            let linked = resolve(tree, &dir.join("libcuda.so.1"))?;
            (version_of(&file_name(&linked)) == Some(v)).then(|| (v.clone(), linked))
        })
        .or_else(|| {
            searched
                .first()
                .map(|(dir, v)| (v.clone(), dir.join(format!("libcuda.so.{v}"))))
        })
}

/// `dirs` with `dir` added at the end unless it is there already (first-seen order).
fn with_dir(mut dirs: Vec<PathBuf>, dir: &Path) -> Vec<PathBuf> {
    if !dirs.iter().any(|d| d == dir) {
        dirs.push(dir.to_path_buf());
    }
    dirs
}

/// The directories of the loader cache's files of `version`.
fn cached_library_dirs<'a>(
    entries: impl Iterator<Item = &'a (String, PathBuf)>,
    version: &str,
) -> Vec<PathBuf> {
    let suffix = format!(".so.{version}");
    entries
        .filter(|(_, file)| file_name(file).ends_with(&suffix))
        .filter_map(|(_, file)| file.parent())
        .fold(Vec::new(), with_dir)
}

/// The driver's libraries of `version` in `dirs` and their `vdpau/` subdirectories, each with
/// the symlinks beside it that resolve to it.
fn libraries_in(tree: &dyn Tree, dirs: &[PathBuf], version: &str) -> Vec<Library> {
    let suffix = format!(".so.{version}");
    let with_vdpau = dirs
        .iter()
        .flat_map(|d| [d.clone(), d.join("vdpau")])
        .filter(|d| tree.kind(d) == Some(FileKind::Dir));
    let mut libraries = Vec::new();
    for dir in with_vdpau {
        let names = tree.list(&dir);
        for name in names
            .iter()
            .filter(|n| n.starts_with("lib") && n.ends_with(&suffix))
        {
            let path = dir.join(name);
            if !is_regular(tree, &path) {
                continue;
            }
            let aliases: Vec<String> = names
                .iter()
                .filter(|other| *other != name)
                .filter(|other| matches!(tree.kind(&dir.join(other)), Some(FileKind::Symlink(_))))
                .filter(|other| resolve(tree, &dir.join(other)).as_deref() == Some(path.as_path()))
                .cloned()
                .collect();
            libraries.push(Library { path, aliases });
        }
    }
    libraries
}

/// The driver's executables found in the binary directories (first directory wins).
fn binaries(tree: &dyn Tree) -> Vec<Placed> {
    BINARIES
        .iter()
        .filter_map(|name| {
            BINARY_DIRS.iter().find_map(|dir| {
                let target = Path::new(dir).join(name);
                let source = resolve(tree, &target)?;
                matches!(tree.kind(&source), Some(FileKind::File { mode }) if mode & 0o111 != 0)
                    .then_some(Placed { source, target })
            })
        })
        .collect()
}

/// The GSP firmware files of `version` (first directory wins for a name).
fn firmware(tree: &dyn Tree, version: &str) -> Vec<Placed> {
    let mut firmware: Vec<Placed> = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in FIRMWARE_DIRS {
        let Some(dir) = resolve(tree, &Path::new(dir).join("nvidia").join(version)) else {
            continue;
        };
        for name in tree.list(&dir) {
            let gsp = name.starts_with("gsp") && name.ends_with(".bin");
            if !(gsp && seen.insert(name.clone())) {
                continue;
            }
            if let Some(source) = resolve(tree, &dir.join(&name)).filter(|s| is_regular(tree, s)) {
                firmware.push(Placed {
                    source,
                    target: Path::new(FIRMWARE_IN_CONTAINER)
                        .join("nvidia")
                        .join(version)
                        .join(&name),
                });
            }
        }
    }
    firmware
}

/// The driver's IPC sockets that exist (persistenced, fabric manager), each once.
fn ipc_sockets(tree: &dyn Tree) -> Vec<PathBuf> {
    IPC_SOCKETS
        .iter()
        .filter_map(|p| resolve(tree, Path::new(p)))
        .filter(|p| tree.kind(p) == Some(FileKind::Socket))
        .fold(Vec::new(), |mut all, p| {
            if !all.contains(&p) {
                all.push(p);
            }
            all
        })
}
