//! The CDI container edits that give a container the driver (pure).
//!
//! - Every library file is bind-mounted read-only at its path in the root, and again under each
//!   of its other names (`libcuda.so.1`, `libcuda.so`): a container gets regular files under the
//!   names programs ask for, without a hook having to make symlinks in its root filesystem.
//! - Binaries at their path in the root (on a container's `PATH` for the usual roots), firmware
//!   under `/lib/firmware/nvidia/<version>/`, the daemons' sockets read-write.
//! - A `createContainer` hook, `tessera-cdi-hook update-ldcache`, adds the libraries to the
//!   container's `/etc/ld.so.cache`, so the container's own loader finds `libcuda.so.1` whatever
//!   directory the root keeps it in and whatever distribution the image is (see
//!   [`crate::hook`]).
//! - Device nodes: path in the container = the node's path under `/`; the host path is under the
//!   device root when that is not `/`.
//!
//! Host paths are the driver root's path on the host joined with the path in the root.

use std::path::{Path, PathBuf};

use tessera_cdi::{ContainerEdits, DeviceNode, Hook, HookName, Mount};

use crate::discover::DriverFiles;

/// The hook's file name (the node plugin installs it on the host).
pub const HOOK_BINARY: &str = "tessera-cdi-hook";
/// The hook's command that updates the container's loader cache.
pub const UPDATE_LDCACHE: &str = "update-ldcache";

/// Mount options of driver files: read-only, no set-uid, no devices.
pub const FILE_MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Mount options of the daemons' sockets (written to, never executed).
pub const SOCKET_MOUNT_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];

/// Where the driver is on the host, and the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// The driver root on the host (what the container runtime opens).
    pub driver_root: PathBuf,
    /// The root device nodes are under on the host (`/` on real nodes).
    pub dev_root: PathBuf,
    /// `tessera-cdi-hook` on the host; `None` leaves the loader cache alone.
    pub hook: Option<PathBuf>,
}

/// `root` + `path in root`, as a string for a CDI spec.
pub fn host_path(root: &Path, in_root: &Path) -> String {
    root.join(in_root.strip_prefix("/").unwrap_or(in_root))
        .display()
        .to_string()
}

fn bind(host: String, container: &Path, options: &[&str]) -> Mount {
    Mount {
        host_path: host,
        container_path: container.display().to_string(),
        options: options.iter().map(|o| (*o).to_owned()).collect(),
        mount_type: Some("bind".to_owned()),
    }
}

/// The device node at `path` (e.g. `/dev/nvidia0`), taken from the device root.
pub fn device_node(path: &str, dev_root: &Path) -> DeviceNode {
    DeviceNode {
        path: path.to_owned(),
        host_path: (dev_root != Path::new("/")).then(|| host_path(dev_root, Path::new(path))),
        ..DeviceNode::default()
    }
}

/// The loader cache entries for the libraries: each name in its directory, `name=path`.
pub fn ldcache_arguments(files: &DriverFiles) -> Vec<String> {
    files
        .libraries
        .iter()
        .flat_map(|library| {
            library
                .names()
                .map(|name| format!("{name}={}", library.dir().join(&name).display()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The edits that give a container the driver's files.
pub fn driver_edits(files: &DriverFiles, injection: &Injection) -> ContainerEdits {
    let root = &injection.driver_root;
    let mut mounts = Vec::new();
    for library in &files.libraries {
        let host = host_path(root, &library.path);
        for name in library.names() {
            mounts.push(bind(
                host.clone(),
                &library.dir().join(name),
                &FILE_MOUNT_OPTIONS,
            ));
        }
    }
    for placed in files.binaries.iter().chain(&files.firmware) {
        mounts.push(bind(
            host_path(root, &placed.source),
            &placed.target,
            &FILE_MOUNT_OPTIONS,
        ));
    }
    for socket in &files.ipc_sockets {
        mounts.push(bind(host_path(root, socket), socket, &SOCKET_MOUNT_OPTIONS));
    }
    let mut hooks = Vec::new();
    if let Some(hook) = &injection.hook
        && !files.libraries.is_empty()
    {
        let mut args = vec![HOOK_BINARY.to_owned(), UPDATE_LDCACHE.to_owned()];
        for entry in ldcache_arguments(files) {
            args.push("--library".to_owned());
            args.push(entry);
        }
        hooks.push(Hook {
            hook_name: HookName::CreateContainer,
            path: hook.display().to_string(),
            args,
            env: Vec::new(),
            timeout: Some(10),
        });
    }
    ContainerEdits {
        mounts,
        hooks,
        ..ContainerEdits::default()
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;
    use crate::discover::{Library, Placed};

    fn files() -> DriverFiles {
        DriverFiles {
            version: "550.54.15".into(),
            version_from: "/lib64/libcuda.so.550.54.15".into(),
            libraries: vec![Library {
                path: "/lib64/libcuda.so.550.54.15".into(),
                aliases: vec!["libcuda.so.1".into()],
            }],
            from_loader_cache: false,
            binaries: vec![Placed {
                source: "/bin/nvidia-smi".into(),
                target: "/bin/nvidia-smi".into(),
            }],
            firmware: vec![Placed {
                source: "/firmware/nvidia/550.54.15/gsp_ga10x.bin".into(),
                target: "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin".into(),
            }],
            ipc_sockets: vec!["/run/nvidia-persistenced/socket".into()],
        }
    }

    #[test]
    fn files_are_mounted_under_every_name_from_the_host_root() {
        let injection = Injection {
            driver_root: "/home/kubernetes/bin/nvidia".into(),
            dev_root: "/".into(),
            hook: Some("/var/lib/kubelet/plugins/gpu.tessera.dev/tessera-cdi-hook".into()),
        };
        let edits = driver_edits(&files(), &injection);
        let pairs: Vec<(&str, &str)> = edits
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (
                    "/home/kubernetes/bin/nvidia/lib64/libcuda.so.550.54.15",
                    "/lib64/libcuda.so.550.54.15"
                ),
                (
                    "/home/kubernetes/bin/nvidia/lib64/libcuda.so.550.54.15",
                    "/lib64/libcuda.so.1"
                ),
                (
                    "/home/kubernetes/bin/nvidia/bin/nvidia-smi",
                    "/bin/nvidia-smi"
                ),
                (
                    "/home/kubernetes/bin/nvidia/firmware/nvidia/550.54.15/gsp_ga10x.bin",
                    "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"
                ),
                (
                    "/home/kubernetes/bin/nvidia/run/nvidia-persistenced/socket",
                    "/run/nvidia-persistenced/socket"
                ),
            ]
        );
        assert_eq!(edits.mounts[0].options, FILE_MOUNT_OPTIONS);
        assert_eq!(edits.mounts[4].options, SOCKET_MOUNT_OPTIONS);
        assert_eq!(edits.hooks.len(), 1);
        assert_eq!(edits.hooks[0].hook_name, HookName::CreateContainer);
        assert_eq!(
            edits.hooks[0].args,
            vec![
                "tessera-cdi-hook",
                "update-ldcache",
                "--library",
                "libcuda.so.550.54.15=/lib64/libcuda.so.550.54.15",
                "--library",
                "libcuda.so.1=/lib64/libcuda.so.1"
            ]
        );
    }

    #[test]
    fn a_host_install_mounts_paths_as_they_are_and_device_nodes_need_no_host_path() {
        let injection = Injection {
            driver_root: "/".into(),
            dev_root: "/".into(),
            hook: None,
        };
        let edits = driver_edits(&files(), &injection);
        assert_eq!(edits.mounts[0].host_path, "/lib64/libcuda.so.550.54.15");
        assert!(edits.hooks.is_empty());
        assert_eq!(device_node("/dev/nvidia0", Path::new("/")).host_path, None);
        assert_eq!(
            device_node(
                "/dev/nvidia-caps/nvidia-cap3",
                Path::new("/var/lib/mock/dev-root")
            )
            .host_path,
            Some("/var/lib/mock/dev-root/dev/nvidia-caps/nvidia-cap3".into())
        );
    }
}
