//! Which CUDA devices a process sees, and in which order (pure).
//!
//! The rules a real `libcuda.so.1` follows, for the parts a checker can observe:
//! - the physical devices are the GPUs the driver lets this process open; here, the GPUs
//!   `libnvidia-ml.so.1` reports (a fake driver root's copy reports the GPUs whose device nodes
//!   the process sees), in NVML order, which is PCI order;
//! - a GPU in MIG mode is not a CUDA device itself: its MIG devices are;
//! - `CUDA_VISIBLE_DEVICES`, when set, selects and orders them: each comma-separated entry is an
//!   index into that list, a `GPU-<uuid>` (a unique prefix is enough) or a `MIG-<uuid>`; the
//!   first entry that names nothing ends the list, and a device named twice is taken once;
//!   an empty value hides every device.
//!
//! - `cuDeviceTotalMem` of a whole GPU is its memory less what the driver reserves for itself:
//!   a real H100 80GB (driver 580) reports 85,017,493,504 B where NVML reports 85,520,809,984 B,
//!   the 480 MiB `nvidia-smi -q` lists as "Reserved". The fake takes 480 MiB off every whole GPU
//!   (the reserve of other models and of MIG devices was not measured; MIG devices report their
//!   NVML memory).
//!
//! `NVIDIA_VISIBLE_DEVICES` is not read: it is the container toolkit's variable, which a real
//! libcuda ignores too.

use tessera_gpu_inventory::GpuInventory;

/// One CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDevice {
    /// `GPU-<uuid>` or `MIG-<uuid>`.
    pub uuid: String,
    /// `cuDeviceGetName`: the product name, or `<product> MIG <profile>`.
    pub name: String,
    /// `cuDeviceTotalMem`, in bytes.
    pub memory_bytes: u64,
    /// Compute capability.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// PCI bus id of the (parent) GPU, `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// Minor number of the (parent) GPU's `/dev/nvidia<minor>`.
    pub gpu_minor: u32,
}

/// What the driver keeps of a whole GPU's memory, which `cuDeviceTotalMem` does not report
/// (measured on an H100 80GB, driver 580).
pub const DRIVER_RESERVED_BYTES: u64 = 480 << 20;

/// The devices before `CUDA_VISIBLE_DEVICES`: every non-MIG GPU, and the MIG devices of MIG
/// GPUs, in NVML order.
pub fn physical(inventory: &GpuInventory) -> Vec<CudaDevice> {
    let mut devices = Vec::new();
    for gpu in &inventory.gpus {
        let cc = (
            gpu.cuda_compute_capability.major,
            gpu.cuda_compute_capability.minor,
        );
        match gpu.mig.as_ref().filter(|mig| mig.enabled) {
            Some(mig) => {
                for instance in &mig.instances {
                    devices.push(CudaDevice {
                        uuid: instance.uuid.clone(),
                        name: format!("{} MIG {}", gpu.product_name, instance.profile),
                        memory_bytes: instance.memory_bytes,
                        compute_capability: cc,
                        multiprocessors: instance.multiprocessors,
                        pci_bus_id: gpu.pci_bus_id.clone(),
                        gpu_minor: gpu.minor,
                    });
                }
            }
            None => devices.push(CudaDevice {
                uuid: gpu.uuid.clone(),
                name: gpu.product_name.clone(),
                memory_bytes: gpu.memory_bytes.saturating_sub(DRIVER_RESERVED_BYTES),
                compute_capability: cc,
                multiprocessors: gpu.multiprocessors,
                pci_bus_id: gpu.pci_bus_id.clone(),
                gpu_minor: gpu.minor,
            }),
        }
    }
    devices
}

/// The devices a process with `cuda_visible_devices` (the variable's value, if set) sees.
pub fn visible(physical: Vec<CudaDevice>, cuda_visible_devices: Option<&str>) -> Vec<CudaDevice> {
    let Some(selection) = cuda_visible_devices else {
        return physical;
    };
    let mut chosen: Vec<usize> = Vec::new();
    for entry in selection.split(',').map(str::trim) {
        let Some(position) = resolve(&physical, entry) else {
            break;
        };
        if !chosen.contains(&position) {
            chosen.push(position);
        }
    }
    chosen.into_iter().map(|i| physical[i].clone()).collect()
}

fn resolve(physical: &[CudaDevice], entry: &str) -> Option<usize> {
    if entry.is_empty() {
        return None;
    }
    if let Ok(index) = entry.parse::<usize>() {
        return (index < physical.len()).then_some(index);
    }
    if !(entry.starts_with("GPU-") || entry.starts_with("MIG-")) {
        return None;
    }
    let mut matches = physical
        .iter()
        .enumerate()
        .filter(|(_, device)| device.uuid.starts_with(entry));
    let first = matches.next()?;
    // An ambiguous prefix names nothing.
    matches.next().is_none().then_some(first.0)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use tessera_gpu_inventory::{DeviceSource, MockSource};

    use super::*;

    fn uuids(devices: &[CudaDevice]) -> Vec<&str> {
        devices.iter().map(|d| d.uuid.as_str()).collect()
    }

    #[test]
    fn whole_gpus_in_nvml_order_and_selected_by_index_or_uuid() {
        let inventory = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
        let all = physical(&inventory);
        assert_eq!(all.len(), 8);
        assert_eq!(all[0].name, inventory.gpus[0].product_name);
        assert_eq!(
            all[0].memory_bytes,
            inventory.gpus[0].memory_bytes - DRIVER_RESERVED_BYTES
        );
        let g = |i: usize| inventory.gpus[i].uuid.as_str();

        assert_eq!(uuids(&visible(all.clone(), None)).len(), 8);
        assert_eq!(uuids(&visible(all.clone(), Some("3,1"))), vec![g(3), g(1)]);
        let by_uuid = format!("{},{}", g(5), &g(2)[..12]);
        assert_eq!(
            uuids(&visible(all.clone(), Some(&by_uuid))),
            vec![g(5), g(2)]
        );
        // The first entry naming nothing ends the list; duplicates count once.
        assert_eq!(uuids(&visible(all.clone(), Some("2,9,1"))), vec![g(2)]);
        assert_eq!(
            uuids(&visible(all.clone(), Some("2, 2 ,4"))),
            vec![g(2), g(4)]
        );
        assert_eq!(
            uuids(&visible(all.clone(), Some("GPU-nope,1"))),
            Vec::<&str>::new()
        );
        assert!(visible(all.clone(), Some("")).is_empty());
        // "GPU-" alone is ambiguous.
        assert!(visible(all, Some("GPU-")).is_empty());
    }

    #[test]
    fn mig_gpus_contribute_their_mig_devices() {
        let inventory = MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let all = physical(&inventory);
        let gpu1 = &inventory.gpus[1];
        let mig = gpu1.mig.as_ref().unwrap();
        assert!(
            !uuids(&all).contains(&gpu1.uuid.as_str()),
            "a MIG GPU is not a device"
        );
        let instance = &mig.instances[0];
        let device = all.iter().find(|d| d.uuid == instance.uuid).unwrap();
        assert_eq!(
            device.name,
            format!("{} MIG {}", gpu1.product_name, instance.profile)
        );
        assert_eq!(device.memory_bytes, instance.memory_bytes);
        assert_eq!(device.gpu_minor, gpu1.minor);
        assert_eq!(
            uuids(&visible(all, Some(&instance.uuid))),
            vec![instance.uuid.as_str()]
        );
    }
}
