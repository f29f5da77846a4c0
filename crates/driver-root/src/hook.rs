//! `tessera-cdi-hook update-ldcache`: the `createContainer` hook of Tessera's CDI specs. It adds
//! the driver's libraries to the container's `/etc/ld.so.cache` — in front of any entry of the
//! same name — so the container's loader finds `libcuda.so.1` whatever directory the driver root
//! keeps it in and whatever distribution the image is. It also lists their directories in
//! `/etc/ld.so.conf.d/000-tessera-driver.conf` when the image has that directory, so an
//! `ldconfig` run later in the container keeps them.
//!
//! How it runs: the runtime starts it after the container's mounts are made (the driver files
//! are bind-mounted by then) and before the container's process starts, with the container's
//! state (`bundle`) on stdin; the root filesystem is `root.path` of the bundle's `config.json`.
//!
//! Why not run the image's `ldconfig`, as NVIDIA's hook does: the image may not have one
//! (distroless, scratch), and running a program from the image as root on the host is a risk
//! this hook avoids. Writing the cache needs no program from the image: this crate writes the
//! format (checked against glibc in its tests).
//!
//! The container's root filesystem belongs to the image, which may hold symlinks meant to send
//! a privileged writer elsewhere (`/etc -> /host/etc`). Every path inside it is resolved with
//! `openat2(RESOLVE_IN_ROOT)`, so links resolve inside the container's root; on kernels without
//! `openat2` (before 5.6) no symlink is followed at all. Files are replaced by a rename, never
//! written through.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::Deserialize;

use crate::ldcache::{Entry, LdCache};

/// The file listing the driver's directories for a later `ldconfig`.
pub const CONF_FILE: &str = "000-tessera-driver.conf";

/// The hook failed; the container is not created (the runtime reports this text).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("tessera-cdi-hook: {0}")]
    Usage(String),
    #[error("tessera-cdi-hook: reading the container state from stdin: {0}")]
    State(String),
    #[error("tessera-cdi-hook: {path}: {source}", path = path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "tessera-cdi-hook: the container's {0} is not a cache the loader reads; not replacing it"
    )]
    Cache(String),
}

/// `update-ldcache`'s arguments: `--library <name>=<path in the container>`, repeated.
pub fn parse_libraries(args: &[String]) -> Result<Vec<Entry>, HookError> {
    let mut entries = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let value = match arg.as_str() {
            "--library" => rest
                .next()
                .ok_or_else(|| HookError::Usage("--library needs <name>=<path>".into()))?,
            other => match other.strip_prefix("--library=") {
                Some(value) => value,
                None => return Err(HookError::Usage(format!("unknown argument `{other}`"))),
            },
        };
        let (name, path) = value
            .split_once('=')
            .filter(|(n, p)| !n.is_empty() && !n.contains('/') && p.starts_with('/'))
            .ok_or_else(|| {
                HookError::Usage(format!(
                    "--library {value}: expected <file name>=<absolute path>"
                ))
            })?;
        entries.push(Entry::native(name, path));
    }
    if entries.is_empty() {
        return Err(HookError::Usage("no --library given".into()));
    }
    Ok(entries)
}

#[derive(Deserialize)]
struct State {
    bundle: PathBuf,
}

#[derive(Deserialize)]
struct Config {
    root: ConfigRoot,
}

#[derive(Deserialize)]
struct ConfigRoot {
    path: PathBuf,
}

/// The container's root filesystem, from the OCI state a hook gets on stdin.
pub fn container_root(state: &[u8]) -> Result<PathBuf, HookError> {
    let state: State =
        serde_json::from_slice(state).map_err(|e| HookError::State(e.to_string()))?;
    let config_path = state.bundle.join("config.json");
    let bytes = std::fs::read(&config_path).map_err(|source| HookError::Io {
        path: config_path.clone(),
        source,
    })?;
    let config: Config = serde_json::from_slice(&bytes)
        .map_err(|e| HookError::State(format!("{}: {e}", config_path.display())))?;
    let root = if config.root.path.is_absolute() {
        config.root.path
    } else {
        state.bundle.join(config.root.path)
    };
    if root == Path::new("/") {
        return Err(HookError::State(
            "the container's root is the host's /; refusing to touch it".into(),
        ));
    }
    Ok(root)
}

/// Opens `path` (relative, inside the root `root`) without leaving the root.
fn open_in(root: &OwnedFd, path: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
    match rustix::fs::openat2(
        root,
        path,
        flags | OFlags::CLOEXEC,
        mode,
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {
            // No openat2: walk the components, following no link at all.
            let mut dir: Option<OwnedFd> = None;
            let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            for (i, part) in parts.iter().enumerate() {
                let last = i + 1 == parts.len();
                let at = dir.as_ref().unwrap_or(root);
                let step_flags = if last {
                    flags
                } else {
                    OFlags::RDONLY | OFlags::DIRECTORY
                };
                dir = Some(rustix::fs::openat(
                    at,
                    *part,
                    step_flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    mode,
                )?);
            }
            dir.ok_or(rustix::io::Errno::INVAL)
        }
        other => other,
    }
}

/// Replaces `name` in directory `dir` with `bytes` (temporary file, then rename).
fn replace(dir: &OwnedFd, name: &str, bytes: &[u8], shown: &Path) -> Result<(), HookError> {
    let io = |source: std::io::Error| HookError::Io {
        path: shown.to_path_buf(),
        source,
    };
    let temp = format!(".{name}.tessera-{}", std::process::id());
    let _ = rustix::fs::unlinkat(dir, temp.as_str(), rustix::fs::AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| io(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(io)?;
    drop(file);
    rustix::fs::renameat(dir, temp.as_str(), dir, name).map_err(|e| io(e.into()))
}

/// Adds `libraries` to the loader cache of the container whose root filesystem is `rootfs`.
pub fn update_ldcache(rootfs: &Path, libraries: Vec<Entry>) -> Result<(), HookError> {
    let root = rustix::fs::open(
        rootfs,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno_at(rootfs, ""))?;
    let mut cache = read_cache(&root, rootfs)?;
    let mut dirs: Vec<String> = Vec::new();
    for entry in &libraries {
        if let Some(dir) = Path::new(&entry.path).parent() {
            let dir = dir.display().to_string();
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    cache.prefer(libraries);
    let etc = open_or_create_etc(&root, rootfs)?;
    replace(
        &etc,
        "ld.so.cache",
        &cache.to_bytes(),
        &rootfs.join("etc/ld.so.cache"),
    )?;
    write_conf_d(&root, rootfs, &dirs)
}

/// Maps an errno on `path` (relative to the container's root `rootfs`) to a [`HookError::Io`].
fn errno_at(rootfs: &Path, path: &str) -> impl FnOnce(rustix::io::Errno) -> HookError {
    let shown = rootfs.join(path);
    move |e| HookError::Io {
        path: shown,
        source: e.into(),
    }
}

/// The container's `/etc/ld.so.cache`, or an empty cache when the image has none.
fn read_cache(root: &OwnedFd, rootfs: &Path) -> Result<LdCache, HookError> {
    match open_in(root, "etc/ld.so.cache", OFlags::RDONLY, Mode::empty()) {
        Ok(fd) => {
            let mut bytes = Vec::new();
            std::fs::File::from(fd)
                .read_to_end(&mut bytes)
                .map_err(|source| HookError::Io {
                    path: rootfs.join("etc/ld.so.cache"),
                    source,
                })?;
            LdCache::parse(&bytes).map_err(|e| HookError::Cache(format!("/etc/ld.so.cache ({e})")))
        }
        Err(rustix::io::Errno::NOENT) => Ok(LdCache::default()),
        Err(e) => Err(errno_at(rootfs, "etc/ld.so.cache")(e)),
    }
}

/// The container's `/etc`, created when the image has none.
fn open_or_create_etc(root: &OwnedFd, rootfs: &Path) -> Result<OwnedFd, HookError> {
    let open = || {
        open_in(
            root,
            "etc",
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
    };
    match open() {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) => {
            rustix::fs::mkdirat(root, "etc", Mode::from_raw_mode(0o755))
                .map_err(errno_at(rootfs, "etc"))?;
            open().map_err(errno_at(rootfs, "etc"))
        }
        Err(e) => Err(errno_at(rootfs, "etc")(e)),
    }
}

/// Names the library directories in `/etc/ld.so.conf.d` (when the image has that directory), so
/// an `ldconfig` run inside the container keeps them.
fn write_conf_d(root: &OwnedFd, rootfs: &Path, dirs: &[String]) -> Result<(), HookError> {
    let Ok(conf_d) = open_in(
        root,
        "etc/ld.so.conf.d",
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    ) else {
        return Ok(());
    };
    let text = format!(
        "# The NVIDIA driver's libraries, injected by Tessera (gpu.tessera.dev).\n{}\n",
        dirs.join("\n")
    );
    replace(
        &conf_d,
        CONF_FILE,
        text.as_bytes(),
        &rootfs.join("etc/ld.so.conf.d").join(CONF_FILE),
    )
}

/// The hook's entry point: `args` after the program name.
pub fn run(args: &[String], stdin: &mut dyn Read) -> Result<(), HookError> {
    match args.first().map(String::as_str) {
        Some(crate::edits::UPDATE_LDCACHE) => {
            let libraries = parse_libraries(&args[1..])?;
            let mut state = Vec::new();
            stdin
                .read_to_end(&mut state)
                .map_err(|e| HookError::State(e.to_string()))?;
            let rootfs = container_root(&state)?;
            update_ldcache(&rootfs, libraries)
        }
        Some(other) => Err(HookError::Usage(format!(
            "unknown command `{other}`; the command is update-ldcache"
        ))),
        None => Err(HookError::Usage(
            "usage: tessera-cdi-hook update-ldcache --library <name>=<path>... (OCI state on stdin)"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_files_and_absolute_paths() {
        let args: Vec<String> = [
            "--library",
            "libcuda.so.1=/usr/lib64/libcuda.so.1",
            "--library=libcuda.so=/usr/lib64/libcuda.so",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let entries = parse_libraries(&args).unwrap();
        assert_eq!(entries[0].name, "libcuda.so.1");
        assert_eq!(entries[1].path, "/usr/lib64/libcuda.so");
        for bad in [
            vec!["--library"],
            vec!["--library", "libcuda.so.1"],
            vec!["--library", "libcuda.so.1=relative/path"],
            vec!["--library", "dir/libcuda.so.1=/x"],
            vec!["--folder", "/x"],
            vec![],
        ] {
            let bad: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(parse_libraries(&bad).is_err(), "{bad:?}");
        }
    }
}
