//! A read-only view of a directory tree that never follows a symlink by itself: discovery
//! resolves links inside the driver root ([`resolve`]), where an absolute target such as
//! `/usr/lib/x86_64-linux-gnu/libcuda.so.1` means a path in the root, not on the host.
//!
//! [`HostTree`] reads a real directory; [`MemoryTree`] describes one in tests (the surveyed
//! layouts are written that way).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// What a path is, without following it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file with its permission bits.
    File {
        mode: u32,
    },
    Dir,
    Symlink(PathBuf),
    Socket,
    /// A character device node.
    CharDevice,
    Other,
}

/// Paths are absolute inside the tree (`/usr/lib`).
pub trait Tree {
    /// What `path` is, or `None` when nothing is there.
    fn kind(&self, path: &Path) -> Option<FileKind>;
    /// Names in directory `path` (not following a final symlink), sorted.
    fn list(&self, path: &Path) -> Vec<String>;
    /// The bytes of regular file `path`.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
}

/// Lexically normalized absolute path: `.` removed, `..` applied but never above `/`.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Follows symlinks in `path` (every component) inside the tree; `None` when something is
/// missing or there are too many links.
pub fn resolve(tree: &dyn Tree, path: &Path) -> Option<PathBuf> {
    let mut hops = 0;
    let mut resolved = PathBuf::from("/");
    let mut pending: Vec<PathBuf> = normalize(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            _ => None,
        })
        .rev()
        .collect();
    while let Some(name) = pending.pop() {
        if name.as_os_str() == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&name);
        match tree.kind(&candidate)? {
            FileKind::Symlink(target) => {
                hops += 1;
                if hops > 40 {
                    return None;
                }
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                for component in target.components().rev() {
                    match component {
                        Component::Normal(n) => pending.push(PathBuf::from(n)),
                        Component::ParentDir => pending.push(PathBuf::from("..")),
                        _ => {}
                    }
                }
            }
            _ => resolved = candidate,
        }
    }
    Some(resolved)
}

/// A directory on this machine seen as a tree rooted at it.
#[derive(Debug, Clone)]
pub struct HostTree {
    root: PathBuf,
}

impl HostTree {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostTree { root: root.into() }
    }

    fn host(&self, path: &Path) -> PathBuf {
        self.root
            .join(normalize(path).strip_prefix("/").unwrap_or(path))
    }
}

impl Tree for HostTree {
    fn kind(&self, path: &Path) -> Option<FileKind> {
        let host = self.host(path);
        let metadata = std::fs::symlink_metadata(&host).ok()?;
        let file_type = metadata.file_type();
        Some(if file_type.is_symlink() {
            FileKind::Symlink(std::fs::read_link(&host).ok()?)
        } else if file_type.is_dir() {
            FileKind::Dir
        } else if file_type.is_file() {
            FileKind::File {
                mode: metadata.permissions().mode() & 0o7777,
            }
        } else if file_type.is_socket() {
            FileKind::Socket
        } else if file_type.is_char_device() {
            FileKind::CharDevice
        } else {
            FileKind::Other
        })
    }

    fn list(&self, path: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.host(path))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(self.host(path))
    }
}

/// A tree described in memory (tests).
#[derive(Debug, Clone, Default)]
pub struct MemoryTree {
    nodes: BTreeMap<PathBuf, (FileKind, Vec<u8>)>,
}

impl MemoryTree {
    pub fn new() -> Self {
        Self::default()
    }

    fn add_parents(&mut self, path: &Path) {
        let mut dir = normalize(path);
        while dir.pop() {
            self.nodes
                .entry(dir.clone())
                .or_insert((FileKind::Dir, Vec::new()));
        }
    }

    /// Adds a regular file (0644 unless `executable`).
    pub fn file(&mut self, path: &str, bytes: &[u8]) -> &mut Self {
        self.add(path, FileKind::File { mode: 0o644 }, bytes)
    }

    /// Adds an executable file.
    pub fn executable(&mut self, path: &str) -> &mut Self {
        self.add(path, FileKind::File { mode: 0o755 }, b"\x7fELF")
    }

    /// Adds a symlink.
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.add(path, FileKind::Symlink(PathBuf::from(target)), b"")
    }

    /// Adds a node of another kind (directory, socket, device).
    pub fn add(&mut self, path: &str, kind: FileKind, bytes: &[u8]) -> &mut Self {
        let path = normalize(Path::new(path));
        self.add_parents(&path);
        self.nodes.insert(path, (kind, bytes.to_vec()));
        self
    }
}

impl Tree for MemoryTree {
    fn kind(&self, path: &Path) -> Option<FileKind> {
        let path = normalize(path);
        if path == Path::new("/") {
            return Some(FileKind::Dir);
        }
        self.nodes.get(&path).map(|(kind, _)| kind.clone())
    }

    fn list(&self, path: &Path) -> Vec<String> {
        let path = normalize(path);
        self.nodes
            .keys()
            .filter(|p| p.parent() == Some(path.as_path()))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self.nodes.get(&normalize(path)) {
            Some((FileKind::File { .. }, bytes)) => Ok(bytes.clone()),
            _ => Err(io::Error::new(
                io::ErrorKind::NotFound,
                path.display().to_string(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_inside_the_tree() {
        let mut tree = MemoryTree::new();
        tree.file("/usr/lib64/libcuda.so.550.54.15", b"")
            .symlink("/usr/lib64/libcuda.so.1", "libcuda.so.550.54.15")
            .symlink("/usr/lib64/libcuda.so", "/usr/lib64/libcuda.so.1")
            .symlink("/lib", "usr/lib64")
            .symlink("/loop", "/loop")
            .symlink("/escape", "../../../etc/passwd");
        let resolved = |p: &str| resolve(&tree, Path::new(p));
        let file = Some(PathBuf::from("/usr/lib64/libcuda.so.550.54.15"));
        assert_eq!(resolved("/usr/lib64/libcuda.so"), file);
        assert_eq!(resolved("/lib/libcuda.so.1"), file);
        assert_eq!(resolved("/lib/../lib/libcuda.so.1"), file);
        assert_eq!(resolved("/loop"), None);
        assert_eq!(
            resolved("/escape"),
            None,
            "`..` stops at the root: /etc/passwd is not there"
        );
        assert_eq!(resolved("/nothing"), None);
        assert_eq!(
            normalize(Path::new("/a/./b/../../../c")),
            PathBuf::from("/c")
        );
    }

    #[test]
    fn a_host_directory_reads_as_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        std::fs::write(dir.path().join("usr/bin/nvidia-smi"), b"x").unwrap();
        std::fs::set_permissions(
            dir.path().join("usr/bin/nvidia-smi"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin", dir.path().join("bin")).unwrap();
        let tree = HostTree::new(dir.path());
        assert_eq!(
            tree.kind(Path::new("/usr/bin/nvidia-smi")),
            Some(FileKind::File { mode: 0o755 })
        );
        assert_eq!(
            tree.kind(Path::new("/bin")),
            Some(FileKind::Symlink("/usr/bin".into()))
        );
        assert_eq!(
            resolve(&tree, Path::new("/bin/nvidia-smi")),
            Some(PathBuf::from("/usr/bin/nvidia-smi")),
            "the absolute link is followed inside the tree, not on the host"
        );
        assert_eq!(tree.list(Path::new("/")), vec!["bin", "usr"]);
    }
}
