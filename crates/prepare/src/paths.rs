//! Paths built from values that came from outside (claim UIDs from the kubelet, the API
//! server or a checkpoint): [`child`] is the one way the node plugin puts such a value into a
//! path, so that no value can name a file outside the directory it belongs in.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// The plugin's state directory and the root of the MPS directories: root only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// A claim's MPS directories, bind-mounted into its containers: readable by their users.
pub const SHARED_DIR_MODE: u32 = 0o755;
/// The checkpoint: root only.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `dir` (and missing parents) and gives it exactly `mode`, whatever the umask.
pub fn create_dir(dir: &Path, mode: u32) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
}

/// A value that cannot name one entry of a directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{}` cannot name an entry of {}: {reason}",
    tessera_kubelet_grpc::bounded(name, 64),
    dir.display()
)]
pub struct UnsafeName {
    /// The value.
    pub name: String,
    /// The directory it was to name an entry of.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// `dir/name`, if `name` is exactly one normal path component (not empty, not `.` or `..`,
/// no `/`, no NUL, at most 255 bytes).
pub fn child(dir: &Path, name: &str) -> Result<PathBuf, UnsafeName> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 255 {
        Some("it is longer than a file name may be")
    } else if name.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        let mut components = Path::new(name).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(part)), None) if part == name => None,
            _ => Some("it is not a single file name"),
        }
    };
    match reason {
        None => Ok(dir.join(name)),
        Some(reason) => Err(UnsafeName {
            name: name.to_owned(),
            dir: dir.to_owned(),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_names_are_joined() {
        let dir = Path::new("/var/lib/tessera/mps");
        assert_eq!(
            child(dir, "8d4f3c2e-0000-4000-8000-000000000001").unwrap(),
            dir.join("8d4f3c2e-0000-4000-8000-000000000001")
        );
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "/etc",
            "a/",
            "x\0y",
            "c1a1/../../../etc",
        ] {
            let error = child(dir, bad).unwrap_err();
            assert!(
                error.to_string().contains("cannot name an entry"),
                "{bad:?}"
            );
        }
        assert!(child(dir, &"a".repeat(256)).is_err());
    }
}
