//! What NVML does not know about a GPU's PCI attachment, read from sysfs: the PCIe root complex
//! (`pci<domain>:<bus>`, the first component of the device's path under `/sys/devices`) and the
//! NUMA node of the PCI device (`numa_node`, which is the CPU socket the GPU hangs off; NVML's
//! `nvmlDeviceGetNumaNodeId` answers a different question — the NUMA node *of* GPU memory on
//! coherent platforms — so it is not used for this).
//!
//! The sysfs root is injectable so tests can build a fake tree: `<root>/bus/pci/devices/<bdf>`
//! must resolve (usually through a symlink) to a directory whose path contains a `pciDDDD:BB`
//! component.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::error::NvmlError;
use tessera_gpu_inventory::pci::is_pcie_root;

/// The host's sysfs mount.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// A sysfs tree rooted somewhere (the host's `/sys`, or a test's fake tree).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/bus/pci/devices/<bus_id>`.
    pub fn pci_device_path(&self, bus_id: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bus_id)
    }

    /// The PCIe root complex of the PCI device `bus_id` (sysfs form, `0000:18:00.0`), as
    /// `pci<domain>:<bus>`. `None` when sysfs does not list the device (no sysfs mounted, or a
    /// GPU that is not the host's, as with the fake NVML) or its path has no such component (some
    /// virtual machines attach devices outside a host bridge). Other IO errors are errors.
    pub fn pcie_root(&self, gpu: &str, bus_id: &str) -> Result<Option<String>, NvmlError> {
        let link = self.pci_device_path(bus_id);
        let resolved = match fs::canonicalize(&link) {
            Ok(resolved) => resolved,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(NvmlError::PcieRoot {
                    gpu: gpu.to_owned(),
                    bus_id: bus_id.to_owned(),
                    path: link,
                    reason: e.to_string(),
                });
            }
        };
        // Only look below the root: the root's own path may contain anything.
        let root = fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        let below_root = resolved.strip_prefix(&root).unwrap_or(&resolved);
        Ok(below_root
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .map(str::to_ascii_lowercase)
            .find(|name| is_pcie_root(name)))
    }

    /// The NUMA node of the PCI device `bus_id`; `None` when the kernel reports none (-1), has no
    /// NUMA support (no `numa_node` file), or sysfs does not list the device.
    pub fn numa_node(&self, gpu: &str, bus_id: &str) -> Result<Option<u32>, NvmlError> {
        let path = self.pci_device_path(bus_id).join("numa_node");
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(NvmlError::NumaNode {
                    gpu: gpu.to_owned(),
                    path,
                    reason: e.to_string(),
                });
            }
        };
        let value: i64 = text.trim().parse().map_err(|_| NvmlError::NumaNode {
            gpu: gpu.to_owned(),
            path: path.clone(),
            reason: format!("expected an integer, found {:?}", text.trim()),
        })?;
        match value {
            v if v < 0 => Ok(None),
            v => u32::try_from(v).map(Some).map_err(|_| NvmlError::NumaNode {
                gpu: gpu.to_owned(),
                path,
                reason: format!("NUMA node {v} is out of range"),
            }),
        }
    }
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new(DEFAULT_SYSFS_ROOT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs with one PCI device `bdf` below `root_complex`, behind one bridge.
    fn fake_sysfs(dir: &Path, root_complex: &str, bdf: &str, numa: Option<&str>) {
        let device_dir = dir
            .join("devices")
            .join(root_complex)
            .join("0000:17:01.0")
            .join(bdf);
        fs::create_dir_all(&device_dir).unwrap();
        if let Some(numa) = numa {
            fs::write(device_dir.join("numa_node"), numa).unwrap();
        }
        let links = dir.join("bus/pci/devices");
        fs::create_dir_all(&links).unwrap();
        symlink(
            Path::new("../../..")
                .join("devices")
                .join(root_complex)
                .join("0000:17:01.0")
                .join(bdf),
            links.join(bdf),
        )
        .unwrap();
    }

    #[test]
    fn pcie_root_is_the_root_complex_component_of_the_resolved_path() {
        let dir = tempfile::tempdir().unwrap();
        fake_sysfs(dir.path(), "pci0000:17", "0000:18:00.0", Some("1\n"));
        let sysfs = Sysfs::new(dir.path());
        assert_eq!(
            sysfs.pcie_root("GPU-1", "0000:18:00.0").unwrap().as_deref(),
            Some("pci0000:17")
        );
        assert_eq!(sysfs.numa_node("GPU-1", "0000:18:00.0").unwrap(), Some(1));
    }

    #[test]
    fn a_root_path_that_looks_like_a_root_complex_is_not_mistaken_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pci0000:99");
        fake_sysfs(&root, "pci0001:3a", "0001:3b:00.0", None);
        let sysfs = Sysfs::new(&root);
        assert_eq!(
            sysfs.pcie_root("GPU-1", "0001:3b:00.0").unwrap().as_deref(),
            Some("pci0001:3a")
        );
    }

    #[test]
    fn negative_or_absent_numa_node_means_none() {
        let dir = tempfile::tempdir().unwrap();
        fake_sysfs(dir.path(), "pci0000:00", "0000:01:00.0", Some("-1\n"));
        fake_sysfs(dir.path(), "pci0000:40", "0000:41:00.0", None);
        let sysfs = Sysfs::new(dir.path());
        assert_eq!(sysfs.numa_node("GPU-1", "0000:01:00.0").unwrap(), None);
        assert_eq!(sysfs.numa_node("GPU-2", "0000:41:00.0").unwrap(), None);
    }

    #[test]
    fn garbage_numa_node_is_an_error_naming_the_gpu_and_file() {
        let dir = tempfile::tempdir().unwrap();
        fake_sysfs(dir.path(), "pci0000:00", "0000:01:00.0", Some("lots\n"));
        let err = Sysfs::new(dir.path())
            .numa_node("GPU-7", "0000:01:00.0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU-7"), "{err}");
        assert!(err.contains("numa_node"), "{err}");
        assert!(err.contains("\"lots\""), "{err}");
    }

    #[test]
    fn a_gpu_missing_from_sysfs_has_no_pci_facts() {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = Sysfs::new(dir.path());
        assert_eq!(sysfs.pcie_root("GPU-3", "0000:c1:00.0").unwrap(), None);
        assert_eq!(sysfs.numa_node("GPU-3", "0000:c1:00.0").unwrap(), None);
    }

    #[test]
    fn a_path_without_root_complex_has_no_pcie_root() {
        let dir = tempfile::tempdir().unwrap();
        let device_dir = dir.path().join("devices/platform/0000:05:00.0");
        fs::create_dir_all(&device_dir).unwrap();
        fs::create_dir_all(dir.path().join("bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/platform/0000:05:00.0",
            dir.path().join("bus/pci/devices/0000:05:00.0"),
        )
        .unwrap();
        assert_eq!(
            Sysfs::new(dir.path())
                .pcie_root("GPU-1", "0000:05:00.0")
                .unwrap(),
            None
        );
    }
}
