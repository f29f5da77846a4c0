//! Where the plugin's unix sockets live and how they are created and removed.
//!
//! - Registration socket: `<registrar dir>/<driver>-reg.sock`, watched by the kubelet.
//! - DRA socket: `<plugins dir>/<driver>/dra.sock`, announced to the kubelet by `GetInfo`.
//!
//! With rolling updates two plugin pods run side by side on a node, so each uses per-pod
//! names built from its pod UID (hashed when the plain UID would make the path too long), and
//! removes the sockets of this driver's instances that are gone ([`remove_dead_sockets`]).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// The kubelet's default plugin registry directory.
pub const DEFAULT_REGISTRAR_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The kubelet's default plugins directory; the DRA socket lives in `<this>/<driver>/`.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The longest socket path `bind(2)` accepts: `sun_path` is 108 bytes including the
/// terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;
/// Mode of directories this crate creates: the owner (root) only, plus its group reading.
pub const SOCKET_DIR_MODE: u32 = 0o750;
/// Default socket mode: only the owner may connect. The kubelet runs as root.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// Failures to lay out, create or remove the plugin's sockets.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The driver name cannot be used as a file-name component.
    #[error(
        "driver name {name:?} cannot name a socket: {reason}; use the driver's DNS name, e.g. gpu.tessera.dev"
    )]
    InvalidDriverName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The pod UID for rolling-update socket names cannot be used in a file name.
    #[error(
        "pod UID {uid:?} cannot name a rolling-update socket: {reason}; pass metadata.uid through the downward API"
    )]
    InvalidPodUid {
        /// The rejected UID.
        uid: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A socket path exceeds the AF_UNIX limit.
    #[error(
        "socket path {path} is {len} bytes, but AF_UNIX socket paths may have at most {max} bytes; \
         use a shorter {flag}"
    )]
    PathTooLong {
        /// The path that does not fit.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// [`MAX_SOCKET_PATH_BYTES`].
        max: usize,
        /// The setting that decides the directory.
        flag: &'static str,
    },
    /// A relative directory could not be made absolute.
    #[error("cannot make directory {path} absolute: {source}")]
    AbsolutePath {
        /// The relative directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A socket directory could not be created.
    #[error("cannot create socket directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Something other than a socket sits where a socket must go.
    #[error(
        "{path} exists and is not a unix socket; refusing to replace it: move it away if it is not needed"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A socket path could not be inspected.
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A stale socket could not be removed.
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Listening on a socket failed.
    #[error("cannot listen on unix socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The socket's permissions could not be set.
    #[error("cannot set mode {mode:o} on socket {path}: {source}")]
    SetMode {
        /// The socket.
        path: PathBuf,
        /// The mode.
        mode: u32,
        /// The underlying error.
        source: io::Error,
    },
    /// Removing the plugin's own socket at shutdown failed.
    #[error("cannot remove socket {path} at shutdown: {source}")]
    Remove {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// The two socket paths of one plugin instance (both absolute).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketPaths {
    /// The registration socket the kubelet's plugin watcher finds.
    pub registration: PathBuf,
    /// The DRA socket serving the DRA and health services; sent to the kubelet by `GetInfo`.
    pub dra: PathBuf,
}

impl SocketPaths {
    /// Lays out the sockets for `driver_name`; with `rolling_update_pod_uid` the names carry
    /// the pod UID (or a hash of it when the plain UID would exceed the AF_UNIX limit).
    pub fn new(
        driver_name: &str,
        registrar_dir: &Path,
        plugins_dir: &Path,
        rolling_update_pod_uid: Option<&str>,
    ) -> Result<Self, SocketError> {
        check_file_name_part(driver_name).map_err(|reason| SocketError::InvalidDriverName {
            name: driver_name.to_owned(),
            reason,
        })?;
        let registrar_dir = absolute(registrar_dir)?;
        let dra_dir = absolute(plugins_dir)?.join(driver_name);
        let (registration, dra) = match rolling_update_pod_uid {
            None => (
                registrar_dir.join(format!("{driver_name}-reg.sock")),
                dra_dir.join("dra.sock"),
            ),
            Some(uid) => {
                check_file_name_part(uid).map_err(|reason| SocketError::InvalidPodUid {
                    uid: uid.to_owned(),
                    reason,
                })?;
                let uid_hash = hash_prefix(&[uid.as_bytes()], 8);
                let registration = first_that_fits(
                    &registrar_dir,
                    [
                        format!("{driver_name}-{uid}-reg.sock"),
                        format!("{driver_name}-{uid_hash}-reg.sock"),
                        format!(
                            "dra-{}-reg.sock",
                            hash_prefix(&[driver_name.as_bytes(), b"\0", uid.as_bytes()], 16)
                        ),
                    ],
                );
                let dra = first_that_fits(
                    &dra_dir,
                    [format!("dra-{uid}.sock"), format!("dra-{uid_hash}.sock")],
                );
                (registration, dra)
            }
        };
        check_length(&registration, "--kubelet-registrar-directory-path")?;
        check_length(&dra, "--kubelet-plugins-directory-path")?;
        Ok(Self { registration, dra })
    }
}

/// Rejects names that would not stay one file-name component.
fn check_file_name_part(part: &str) -> Result<(), &'static str> {
    if part.is_empty() {
        Err("it is empty")
    } else if part == "." || part == ".." {
        Err("it is a relative directory name")
    } else if part.contains('/') {
        Err("it contains '/'")
    } else if part.contains('\0') {
        Err("it contains a NUL byte")
    } else {
        Ok(())
    }
}

fn absolute(dir: &Path) -> Result<PathBuf, SocketError> {
    std::path::absolute(dir).map_err(|source| SocketError::AbsolutePath {
        path: dir.to_owned(),
        source,
    })
}

/// URL-safe base64 of the first `bytes` bytes of the SHA-256 of the concatenated parts.
fn hash_prefix(parts: &[&[u8]], bytes: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    URL_SAFE_NO_PAD.encode(&hasher.finalize()[..bytes])
}

/// The first candidate whose path fits the AF_UNIX limit, else the last (shortest) one,
/// which then fails [`check_length`] with a clear error.
fn first_that_fits<const N: usize>(dir: &Path, candidates: [String; N]) -> PathBuf {
    let mut paths = candidates.map(|name| dir.join(name));
    match paths
        .iter()
        .position(|path| path.as_os_str().len() <= MAX_SOCKET_PATH_BYTES)
    {
        Some(fits) => std::mem::take(&mut paths[fits]),
        None => std::mem::take(&mut paths[N - 1]),
    }
}

fn check_length(path: &Path, flag: &'static str) -> Result<(), SocketError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(SocketError::PathTooLong {
            path: path.to_owned(),
            len,
            max: MAX_SOCKET_PATH_BYTES,
            flag,
        });
    }
    Ok(())
}

/// A listening socket this plugin created, remembered by inode so that shutdown never
/// removes a socket another process put at the same path since.
#[derive(Debug)]
pub(crate) struct BoundSocket {
    pub(crate) path: PathBuf,
    pub(crate) listener: UnixListener,
    identity: (u64, u64),
}

impl BoundSocket {
    /// Creates the directory (mode [`SOCKET_DIR_MODE`]) if missing, removes a stale socket,
    /// listens, and restricts the socket to `mode` — before anyone can reach it: the socket is
    /// bound in a private staging directory (mode 0700), given its mode, then renamed into
    /// place, so no umask ever leaves it open to others, even briefly.
    pub(crate) fn bind(path: &Path, mode: u32) -> Result<Self, SocketError> {
        Self::bind_observed(path, mode, |_| {})
    }

    /// [`BoundSocket::bind`], calling `bound` with the socket's path right after it was bound,
    /// before it has its mode (tests look at that moment).
    fn bind_observed(
        path: &Path,
        mode: u32,
        bound: impl FnOnce(&Path),
    ) -> Result<Self, SocketError> {
        let dir = path.parent().unwrap_or(Path::new("/"));
        let create_dir = |dir: &Path, mode: u32| {
            let created = !dir.exists();
            fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .and_then(|()| {
                    if created {
                        fs::set_permissions(dir, fs::Permissions::from_mode(mode))
                    } else {
                        Ok(())
                    }
                })
                .map_err(|source| SocketError::CreateDir {
                    path: dir.to_owned(),
                    source,
                })
        };
        create_dir(dir, SOCKET_DIR_MODE)?;
        if remove_stale_socket(path)? {
            tracing::info!(path = %path.display(), "removed stale socket");
        }
        // Short names: the staged path must fit the AF_UNIX limit like the final one.
        let staging = dir.join(format!(".b{:x}", std::process::id()));
        let _ = fs::remove_dir_all(&staging);
        create_dir(&staging, 0o700)?;
        let remove_staging = RemoveOnDrop(Some(staging.clone()), true);
        let staged = staging.join("s");
        check_length(
            &staged,
            "--kubelet-plugins-directory-path or --kubelet-registrar-directory-path",
        )?;
        let listener = UnixListener::bind(&staged).map_err(|source| SocketError::Bind {
            path: path.to_owned(),
            source,
        })?;
        bound(&staged);
        fs::set_permissions(&staged, fs::Permissions::from_mode(mode)).map_err(|source| {
            SocketError::SetMode {
                path: path.to_owned(),
                mode,
                source,
            }
        })?;
        fs::rename(&staged, path).map_err(|source| SocketError::Bind {
            path: path.to_owned(),
            source,
        })?;
        drop(remove_staging);
        // Remove the socket again if anything below fails, so no half-set-up socket remains.
        let cleanup = RemoveOnDrop(Some(path.to_owned()), false);
        listener
            .set_nonblocking(true)
            .map_err(|source| SocketError::Bind {
                path: path.to_owned(),
                source,
            })?;
        let metadata = fs::symlink_metadata(path).map_err(|source| SocketError::Inspect {
            path: path.to_owned(),
            source,
        })?;
        cleanup.disarm();
        Ok(Self {
            path: path.to_owned(),
            listener,
            identity: (metadata.dev(), metadata.ino()),
        })
    }

    /// The path and the inode identity, for removal after the listener is gone.
    pub(crate) fn into_parts(self) -> (UnixListener, OwnedSocketPath) {
        (
            self.listener,
            OwnedSocketPath {
                path: self.path,
                identity: self.identity,
            },
        )
    }
}

/// The path of a socket this plugin created, for removal at shutdown.
#[derive(Debug)]
pub(crate) struct OwnedSocketPath {
    pub(crate) path: PathBuf,
    identity: (u64, u64),
}

impl OwnedSocketPath {
    /// Removes the socket if it is still the one this plugin created; a missing socket or one
    /// replaced by another process is left alone.
    pub(crate) fn remove(&self) -> Result<(), SocketError> {
        match fs::symlink_metadata(&self.path) {
            Ok(metadata) if (metadata.dev(), metadata.ino()) == self.identity => {
                match fs::remove_file(&self.path) {
                    Ok(()) => Ok(()),
                    Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(()),
                    Err(source) => Err(SocketError::Remove {
                        path: self.path.clone(),
                        source,
                    }),
                }
            }
            Ok(_) => {
                tracing::warn!(
                    path = %self.path.display(),
                    "socket was replaced by another process; leaving it in place"
                );
                Ok(())
            }
            Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SocketError::Inspect {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// Removes a leftover socket at `path`; returns whether there was one. Anything that is not a
/// socket is an error: it is not ours to delete.
pub(crate) fn remove_stale_socket(path: &Path) -> Result<bool, SocketError> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            fs::remove_file(path).map_err(|source| SocketError::RemoveStale {
                path: path.to_owned(),
                source,
            })?;
            Ok(true)
        }
        Ok(_) => Err(SocketError::NotASocket {
            path: path.to_owned(),
        }),
        Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(SocketError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Removes the sockets of this driver's plugin instances that are gone, other than `own`: in
/// `registrar_dir` those named `<driver>-…reg.sock` (the fixed name and the per-pod names that
/// carry the driver's name), in `dra_dir` (the driver's own directory) every `dra….sock`. A
/// socket is gone when connecting to it is refused (nothing listens: its process died without
/// removing it); a live instance's socket accepts the connection and stays. Per-pod names of
/// dead pods would otherwise stay forever, since no later pod has the same name. Returns the
/// sockets removed; what cannot be inspected or removed is logged and left.
pub(crate) fn remove_dead_sockets(
    driver_name: &str,
    own: &SocketPaths,
    registrar_dir: &Path,
    dra_dir: &Path,
) -> Vec<PathBuf> {
    let registration_prefix = format!("{driver_name}-");
    let candidates = [
        (registrar_dir, registration_prefix.as_str(), "reg.sock"),
        (dra_dir, "dra", ".sock"),
    ];
    let mut removed = Vec::new();
    for (dir, prefix, suffix) in candidates {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if !name.starts_with(prefix)
                || !name.ends_with(suffix)
                || path == own.registration
                || path == own.dra
                || !entry.file_type().is_ok_and(|t| t.is_socket())
            {
                continue;
            }
            match std::os::unix::net::UnixStream::connect(&path) {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    match fs::remove_file(&path) {
                        Ok(()) => removed.push(path),
                        Err(error) => {
                            tracing::warn!(path = %path.display(), %error, "cannot remove the socket of a plugin instance that is gone");
                        }
                    }
                }
                // Listening (or busy): another instance of this driver is alive.
                _ => {}
            }
        }
    }
    removed
}

/// Removes a file when dropped unless disarmed.
/// A path removed on drop unless disarmed: a file, or (`true`) a directory and its contents.
struct RemoveOnDrop(Option<PathBuf>, bool);

impl RemoveOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        match self.0.take() {
            Some(path) if self.1 => {
                let _ = fs::remove_dir_all(path);
            }
            Some(path) => {
                let _ = fs::remove_file(path);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_never_reachable_before_it_has_its_mode() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("plugins/gpu.tessera.dev/dra.sock");
        let mut at_bind = None;
        let bound = BoundSocket::bind_observed(&path, 0o600, |staged| {
            let parent_mode = fs::metadata(staged.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            at_bind = Some((path.exists(), parent_mode));
        })
        .unwrap();
        assert_eq!(
            at_bind,
            Some((false, 0o700)),
            "(socket at its final path, mode of the directory it was bound in)"
        );
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), SOCKET_DIR_MODE);
        let entries: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(entries, ["dra.sock"], "no staging directory is left");
        std::os::unix::net::UnixStream::connect(&path).expect("the renamed socket answers");
        drop(bound);
    }

    const UID: &str = "0b8e7c1a-3c5e-4d0e-9a57-3c1f4a2b9d10";

    #[test]
    fn sockets_of_dead_instances_go_and_live_ones_stay() {
        let root = tempfile::tempdir().unwrap();
        let (reg, dra) = (root.path().join("reg"), root.path().join("dra"));
        fs::create_dir_all(&reg).unwrap();
        fs::create_dir_all(&dra).unwrap();
        let own = SocketPaths {
            registration: reg.join("gpu.tessera.dev-own-reg.sock"),
            dra: dra.join("dra-own.sock"),
        };
        // A socket whose process is gone: bound, then its listener closed (the file stays).
        let dead = |path: &Path| drop(UnixListener::bind(path).unwrap());
        let dead_paths = [
            reg.join("gpu.tessera.dev-old-reg.sock"),
            reg.join("gpu.tessera.dev-reg.sock"),
            dra.join("dra-old.sock"),
            dra.join("dra.sock"),
        ];
        for path in &dead_paths {
            dead(path);
        }
        let _live = [
            UnixListener::bind(reg.join("gpu.tessera.dev-peer-reg.sock")).unwrap(),
            UnixListener::bind(dra.join("dra-peer.sock")).unwrap(),
        ];
        // Not this driver's, not a socket, or its own: left alone.
        dead(&reg.join("other.example.com-reg.sock"));
        fs::write(reg.join("gpu.tessera.dev-file-reg.sock"), b"").unwrap();
        dead(&own.registration);
        dead(&own.dra);

        let mut removed = remove_dead_sockets("gpu.tessera.dev", &own, &reg, &dra);
        removed.sort();
        let mut expected = dead_paths.to_vec();
        expected.sort();
        assert_eq!(removed, expected);
        for kept in [
            "gpu.tessera.dev-peer-reg.sock",
            "other.example.com-reg.sock",
            "gpu.tessera.dev-file-reg.sock",
            "gpu.tessera.dev-own-reg.sock",
        ] {
            assert!(reg.join(kept).exists(), "{kept}");
        }
        assert!(dra.join("dra-peer.sock").exists() && own.dra.exists());
    }

    #[test]
    fn default_names_follow_the_kubelet_conventions() {
        let paths = SocketPaths::new(
            "gpu.tessera.dev",
            Path::new(DEFAULT_REGISTRAR_DIR),
            Path::new(DEFAULT_PLUGINS_DIR),
            None,
        )
        .unwrap();
        assert_eq!(
            paths.registration,
            Path::new("/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock")
        );
        assert_eq!(
            paths.dra,
            Path::new("/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock")
        );
    }

    #[test]
    fn rolling_update_names_carry_the_pod_uid_when_it_fits() {
        let paths = SocketPaths::new(
            "gpu.tessera.dev",
            Path::new(DEFAULT_REGISTRAR_DIR),
            Path::new(DEFAULT_PLUGINS_DIR),
            Some(UID),
        )
        .unwrap();
        assert_eq!(
            paths.registration,
            Path::new(DEFAULT_REGISTRAR_DIR).join(format!("gpu.tessera.dev-{UID}-reg.sock"))
        );
        assert_eq!(
            paths.dra,
            Path::new(DEFAULT_PLUGINS_DIR).join(format!("gpu.tessera.dev/dra-{UID}.sock"))
        );
    }

    #[test]
    fn rolling_update_names_fall_back_to_hashes_in_long_directories() {
        // 61 bytes: the plain UID no longer fits, the 8-byte hash does.
        let registrar = "/var/snap/microk8s/common/var/lib/kubelet/plugins_registry/x";
        let paths = SocketPaths::new(
            "gpu.tessera.dev",
            Path::new(registrar),
            Path::new(DEFAULT_PLUGINS_DIR),
            Some(UID),
        )
        .unwrap();
        let name = paths.registration.file_name().unwrap().to_str().unwrap();
        assert!(
            name.starts_with("gpu.tessera.dev-") && !name.contains(UID),
            "{name}"
        );
        assert!(paths.registration.as_os_str().len() <= MAX_SOCKET_PATH_BYTES);
        // Stable: the same pod gets the same name after a restart.
        let again = SocketPaths::new(
            "gpu.tessera.dev",
            Path::new(registrar),
            Path::new(DEFAULT_PLUGINS_DIR),
            Some(UID),
        )
        .unwrap();
        assert_eq!(paths, again);
    }

    #[test]
    fn a_path_over_the_limit_is_a_clear_error() {
        let long_dir = format!("/{}", "d".repeat(100));
        let error = SocketPaths::new(
            "gpu.tessera.dev",
            Path::new(DEFAULT_REGISTRAR_DIR),
            Path::new(&long_dir),
            None,
        )
        .unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, SocketError::PathTooLong { len: 126, .. }),
            "{message}"
        );
        assert!(message.contains("at most 107 bytes"), "{message}");
        assert!(
            message.contains("--kubelet-plugins-directory-path"),
            "{message}"
        );
    }

    #[test]
    fn names_that_escape_the_directory_are_rejected() {
        for bad in ["", "..", "a/b"] {
            let error = SocketPaths::new(bad, Path::new("/r"), Path::new("/p"), None).unwrap_err();
            assert!(
                matches!(error, SocketError::InvalidDriverName { .. }),
                "{bad:?}: {error}"
            );
        }
        let error =
            SocketPaths::new("d", Path::new("/r"), Path::new("/p"), Some("../x")).unwrap_err();
        assert!(
            matches!(error, SocketError::InvalidPodUid { .. }),
            "{error}"
        );
    }
}
