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
use crate::tree::{Kind, Tree, resolve};

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
    matches!(tree.kind(path), Some(Kind::File { .. }))
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
    let mut version = None;
    if let Some(entries) = &cached {
        for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            if let Some((_, file)) = entries.iter().find(|(name, _)| name == soname)
                && let Some(v) = version_of(&file_name(file))
            {
                version = Some((v.to_owned(), file.clone()));
                break;
            }
        }
    }
    let from_loader_cache = version.is_some();
    let searched = if version.is_none() {
        searched_versions(tree)
    } else {
        Vec::new()
    };
    if version.is_none() {
        // Several versions (an upgrade's leftovers): the one libcuda.so.1 leads to.
        version = searched.iter().find_map(|(dir, v)| {
            let linked = resolve(tree, &dir.join("libcuda.so.1"))?;
            (version_of(&file_name(&linked)) == Some(v)).then(|| (v.clone(), linked))
        });
        version = version.or_else(|| {
            searched
                .first()
                .map(|(dir, v)| (v.clone(), dir.join(format!("libcuda.so.{v}"))))
        });
    }
    let Some((version, version_from)) = version else {
        return Err(DiscoveryError::NoDriver {
            root: root.to_owned(),
        });
    };
    let suffix = format!(".so.{version}");

    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut add_dir = |dir: &Path| {
        if !dirs.iter().any(|d| d == dir) {
            dirs.push(dir.to_path_buf());
        }
    };
    if from_loader_cache {
        for (_, file) in cached.iter().flatten() {
            if file_name(file).ends_with(&suffix)
                && let Some(dir) = file.parent()
            {
                add_dir(dir);
            }
        }
    } else {
        for (dir, v) in &searched {
            if *v == version {
                add_dir(dir);
            }
        }
    }
    let with_vdpau: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| [d.clone(), d.join("vdpau")])
        .filter(|d| tree.kind(d) == Some(Kind::Dir))
        .collect();

    let mut libraries = Vec::new();
    for dir in &with_vdpau {
        let names = tree.list(dir);
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
                .filter(|other| matches!(tree.kind(&dir.join(other)), Some(Kind::Symlink(_))))
                .filter(|other| resolve(tree, &dir.join(other)).as_deref() == Some(path.as_path()))
                .cloned()
                .collect();
            libraries.push(Library { path, aliases });
        }
    }

    let mut binaries = Vec::new();
    for name in BINARIES {
        let found = BINARY_DIRS.iter().find_map(|dir| {
            let target = Path::new(dir).join(name);
            let source = resolve(tree, &target)?;
            matches!(tree.kind(&source), Some(Kind::File { mode }) if mode & 0o111 != 0)
                .then_some(Placed { source, target })
        });
        binaries.extend(found);
    }

    let mut firmware: Vec<Placed> = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in FIRMWARE_DIRS {
        let Some(dir) = resolve(tree, &Path::new(dir).join("nvidia").join(&version)) else {
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
                        .join(&version)
                        .join(&name),
                });
            }
        }
    }

    let ipc_sockets = IPC_SOCKETS
        .iter()
        .filter_map(|p| resolve(tree, Path::new(p)))
        .filter(|p| tree.kind(p) == Some(Kind::Socket))
        .fold(Vec::new(), |mut all, p| {
            if !all.contains(&p) {
                all.push(p);
            }
            all
        });

    Ok(DriverFiles {
        version,
        version_from,
        libraries,
        from_loader_cache,
        binaries,
        firmware,
        ipc_sockets,
    })
}
