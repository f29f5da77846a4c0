//! What a claim's containers get of the NVIDIA driver: [`DriverInjection`], the spec-level edits
//! every claim spec carries (the driver's libraries under all their names, binaries, firmware,
//! daemon sockets, the loader-cache hook) and the control device nodes that exist under the
//! device root.
//!
//! The node plugin reads the driver root at start and builds the injection from it
//! (`tessera_node::backend::driver_root`), and reads it again when the driver under the root
//! changes version: [`CurrentInjection`] is the injection specs are written with now, replaced
//! while claims are prepared (a spec is built from one injection, the old or the new). Without a
//! driver root (mock nodes without a fake driver) specs carry the device nodes and environment
//! only ([`DriverInjection::none`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tessera_cdi::{ContainerEdits, DeviceNode};
use tessera_driver_root::devices::CONTROL_NODES;
use tessera_driver_root::edits;

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

/// The injection claim specs are written with now; clones share it, and [`CurrentInjection::replace`]
/// changes it for every spec built afterwards.
#[derive(Debug, Clone, Default)]
pub struct CurrentInjection(Arc<RwLock<Arc<DriverInjection>>>);

impl CurrentInjection {
    pub fn new(injection: DriverInjection) -> Self {
        CurrentInjection(Arc::new(RwLock::new(Arc::new(injection))))
    }

    /// The injection now.
    pub fn get(&self) -> Arc<DriverInjection> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Specs built from now on inject `injection`.
    pub fn replace(&self, injection: DriverInjection) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(injection);
    }
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

/// The control nodes present under `dev_root` (this process sees it at that path), and the
/// missing ones.
pub fn control_nodes(dev_root: &Path) -> (Vec<DeviceNode>, Vec<String>) {
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
