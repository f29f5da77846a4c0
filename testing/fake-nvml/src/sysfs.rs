//! A fake sysfs tree for the NVML backend's PCI lookups, built from the same topology the fake
//! NVML answers from: for every GPU with a `pcieRoot`,
//! `<root>/devices/<pcieRoot>/<pciBusId>/numa_node` and the symlink
//! `<root>/bus/pci/devices/<pciBusId>` pointing at it (as on a real host). GPUs without a
//! `pcieRoot` get a device directory outside any root complex; GPUs without `numaNode` get `-1`.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;

use tessera_gpu_inventory::model::GpuInventory;

/// Writes the tree for `inventory` under `root` (which must exist).
pub fn write_fake_sysfs(root: &Path, inventory: &GpuInventory) -> io::Result<()> {
    let links = root.join("bus/pci/devices");
    fs::create_dir_all(&links)?;
    for gpu in &inventory.gpus {
        let parent = match &gpu.pcie_root {
            Some(pcie_root) => Path::new("devices").join(pcie_root),
            None => Path::new("devices").join("platform"),
        };
        let device = parent.join(&gpu.pci_bus_id);
        fs::create_dir_all(root.join(&device))?;
        let numa = gpu
            .numa_node
            .map_or_else(|| "-1".to_owned(), |n| n.to_string());
        fs::write(root.join(&device).join("numa_node"), format!("{numa}\n"))?;
        symlink(
            Path::new("../../..").join(&device),
            links.join(&gpu.pci_bus_id),
        )?;
    }
    Ok(())
}
