//! Driver data embedded in the library file itself: how a copy of the fake becomes *one node's*
//! `libnvidia-ml.so.1` in a fake driver root (`tessera-fake-driver-root`).
//!
//! A real `libnvidia-ml.so.1` learns about the GPUs from the kernel driver, wherever it is loaded:
//! on the host, in the node plugin's container, in a workload container that got it through a
//! CDI spec. A fake that reads an environment variable cannot follow it into a container (nobody
//! sets that variable there), and a data file next to it is not mounted with it. So the library
//! carries its data: a fixed-size region ([`EMBEDDED`]) starts with a magic string and a length,
//! and the layout tool overwrites the region of its copy with the node's [`DriverData`]
//! ([`patch`]). The library reads the region at `nvmlInit_v2` when
//! `TESSERA_FAKE_NVML_TOPOLOGY` is not set (the variable still wins, for tests).
//!
//! With embedded data the fake behaves like NVML in a container: it shows only the GPUs whose
//! device node it can see (`/dev/nvidia<minor>`, or `<dev root>/dev/nvidia<minor>` under the
//! stand-in device root the data names, which is how the host and the node plugin see them), and
//! numbers them `0..n` in that order; of a MIG GPU it shows the MIG devices whose GPU- and
//! compute-instance capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`, standard layout) it can
//! see, as the driver lets a container open only the MIG devices whose capabilities it was given.
//!
//! Hand-written because it is a property of this fake, not a general mechanism. The region is read
//! with volatile reads: its initial content is a compile-time constant, which the compiler could
//! otherwise fold into the reader.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_driver_root::devices::{cap_node, standard_mig_cap_minor};
use tessera_gpu_inventory::GpuInventory;

/// The first bytes of the region; [`patch`] looks for them in the library file.
pub const MAGIC: [u8; 28] = *b"TESSERA_FAKE_DRIVER_DATA_v1:";
/// How many bytes of data fit.
pub const CAPACITY: usize = 512 * 1024;

/// The region: magic, little-endian length, data.
#[repr(C)]
pub struct Region {
    magic: [u8; 28],
    length: [u8; 4],
    bytes: [u8; CAPACITY],
}

/// The region of this library. Its non-zero magic puts it in a file-backed section, so the bytes
/// of the data are really in the file for [`patch`] to overwrite.
#[used]
pub static EMBEDDED: Region = Region {
    magic: MAGIC,
    length: [0; 4],
    bytes: [0; CAPACITY],
};

/// What a fake driver root's `libnvidia-ml.so.1` knows about its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriverData {
    /// The node's topology (docs/topology-format.md), with the node's own UUIDs, as YAML.
    pub topology: String,
    /// The stand-in device root on the host: GPU `n` exists when
    /// `<dev root>/dev/nvidia<minor>` (or `/dev/nvidia<minor>`) does.
    pub dev_root: Option<PathBuf>,
}

/// Why the data cannot be embedded.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error(
        "the library holds {0} copies of the embedded-data magic instead of exactly one; is it \
         a build of tessera-fake-nvml?"
    )]
    Magic(usize),
    #[error("the driver data takes {0} bytes; at most {CAPACITY} fit")]
    TooLarge(usize),
    #[error("cannot encode the driver data: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Overwrites the region in `library` (the bytes of a built `libtessera_fake_nvml.so`) with `data`.
pub fn patch(library: &mut [u8], data: &DriverData) -> Result<(), PatchError> {
    let encoded = serde_json::to_vec(data)?;
    if encoded.len() > CAPACITY {
        return Err(PatchError::TooLarge(encoded.len()));
    }
    let found: Vec<usize> = memchr::memmem::find_iter(library, &MAGIC).collect();
    let [at] = found[..] else {
        return Err(PatchError::Magic(found.len()));
    };
    let length_at = at + MAGIC.len();
    let data_at = length_at + 4;
    if library.len() < data_at + CAPACITY {
        return Err(PatchError::Magic(0));
    }
    library[length_at..data_at].copy_from_slice(&(encoded.len() as u32).to_le_bytes());
    library[data_at..data_at + encoded.len()].copy_from_slice(&encoded);
    library[data_at + encoded.len()..data_at + CAPACITY].fill(0);
    Ok(())
}

/// The data embedded in this library, if the layout tool put any there.
pub fn read() -> Result<Option<DriverData>, String> {
    let region = std::ptr::addr_of!(EMBEDDED);
    // SAFETY: `region` points to a static that lives for the whole program and is never
    // written through this program (the tool patches the file, not the mapping); volatile
    // reads keep the compiler from assuming its initial, all-zero content.
    let length = u32::from_le_bytes(unsafe { std::ptr::read_volatile(&raw const (*region).length) })
        as usize;
    if length == 0 {
        return Ok(None);
    }
    if length > CAPACITY {
        return Err(format!(
            "the embedded driver data claims {length} bytes, more than the {CAPACITY} the region holds"
        ));
    }
    // SAFETY: as above; `bytes` has CAPACITY >= length bytes.
    let start = unsafe { (&raw const (*region).bytes).cast::<u8>() };
    let bytes: Vec<u8> = (0..length)
        // SAFETY: `start.add(i)` stays inside `bytes` because i < length <= CAPACITY.
        .map(|i| unsafe { std::ptr::read_volatile(start.add(i)) })
        .collect();
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("the embedded driver data is not valid: {e}"))
}

/// Where a fake driver root's library keeps GPU settings (time slices) that outlive a process:
/// next to the stand-in device nodes, the fake's "kernel".
pub fn state_dir(dev_root: &Path) -> PathBuf {
    dev_root.join("tessera-fake-gpu-state")
}

/// Whether the device node of GPU minor `minor` exists where this process looks for it.
pub fn device_node_visible(minor: u32, dev_root: Option<&Path>) -> bool {
    let name = format!("nvidia{minor}");
    Path::new("/dev").join(&name).exists()
        || dev_root.is_some_and(|root| root.join("dev").join(&name).exists())
}

/// Whether `node` (`/dev/...`) exists where this process looks for it.
fn node_visible(node: &str, dev_root: Option<&Path>) -> bool {
    Path::new(node).exists()
        || dev_root.is_some_and(|root| root.join(node.trim_start_matches('/')).exists())
}

/// Whether both capability nodes of MIG device (GPU instance `gi`, compute instance `ci`) on GPU
/// minor `minor` exist where this process looks for them.
pub fn mig_caps_visible(minor: u32, gi: u32, ci: u32, dev_root: Option<&Path>) -> bool {
    [None, Some(ci)].into_iter().all(|ci| {
        standard_mig_cap_minor(minor, gi, ci)
            .is_some_and(|cap| node_visible(&cap_node(cap), dev_root))
    })
}

/// The GPUs of `inventory` this process can see (their device nodes exist), numbered `0..n` in
/// the inventory's order, as NVML in a container numbers them, each with the MIG devices whose
/// capability nodes it can see.
pub fn visible_inventory(mut inventory: GpuInventory, dev_root: Option<&Path>) -> GpuInventory {
    inventory
        .gpus
        .retain(|gpu| device_node_visible(gpu.minor, dev_root));
    for gpu in &mut inventory.gpus {
        let minor = gpu.minor;
        if let Some(mig) = gpu.mig.as_mut() {
            mig.instances.retain(|i| {
                mig_caps_visible(minor, i.gpu_instance_id, i.compute_instance_id, dev_root)
            });
        }
    }
    for (index, gpu) in inventory.gpus.iter_mut().enumerate() {
        gpu.index = index as u32;
    }
    inventory
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpu_inventory::DeviceSource;

    fn library_with_region(prefix: usize) -> Vec<u8> {
        let mut bytes = vec![7u8; prefix];
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend(std::iter::repeat_n(0u8, CAPACITY));
        bytes.extend_from_slice(b"tail");
        bytes
    }

    #[test]
    fn patching_writes_length_and_data_after_the_magic() {
        let mut library = library_with_region(100);
        let data = DriverData {
            topology: "gpus: []".into(),
            dev_root: Some("/var/lib/x/dev-root".into()),
        };
        patch(&mut library, &data).unwrap();
        let at = 100 + MAGIC.len();
        let length = u32::from_le_bytes(library[at..at + 4].try_into().unwrap()) as usize;
        let decoded: DriverData =
            serde_json::from_slice(&library[at + 4..at + 4 + length]).unwrap();
        assert_eq!(decoded, data);
        assert!(library.ends_with(b"tail"), "nothing after the region moves");

        // Patching again with shorter data clears what the longer data left.
        let short = DriverData {
            topology: String::new(),
            dev_root: None,
        };
        patch(&mut library, &short).unwrap();
        let length = u32::from_le_bytes(library[at..at + 4].try_into().unwrap()) as usize;
        assert!(
            library[at + 4 + length..at + 4 + CAPACITY]
                .iter()
                .all(|b| *b == 0)
        );
    }

    #[test]
    fn a_file_without_exactly_one_region_is_refused() {
        let data = DriverData {
            topology: String::new(),
            dev_root: None,
        };
        let mut none = vec![0u8; 64];
        assert!(matches!(patch(&mut none, &data), Err(PatchError::Magic(0))));
        let mut two = library_with_region(0);
        two.extend(library_with_region(0));
        assert!(matches!(patch(&mut two, &data), Err(PatchError::Magic(2))));
        let mut big = library_with_region(0);
        let huge = DriverData {
            topology: "x".repeat(CAPACITY),
            dev_root: None,
        };
        assert!(matches!(
            patch(&mut big, &huge),
            Err(PatchError::TooLarge(_))
        ));
    }

    #[test]
    fn an_unpatched_library_has_no_data() {
        assert_eq!(read(), Ok(None));
    }

    #[test]
    fn only_gpus_with_a_device_node_are_visible_and_renumbered() {
        let inventory = tessera_gpu_inventory::MockSource::new("dgx-h100")
            .unwrap()
            .inventory()
            .unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        let third = &inventory.gpus[3];
        std::fs::write(root.path().join(format!("dev/nvidia{}", third.minor)), b"").unwrap();
        let visible = visible_inventory(inventory.clone(), Some(root.path()));
        // (On a machine with real GPUs, their /dev/nvidia<minor> count too.)
        let expected: Vec<&str> = inventory
            .gpus
            .iter()
            .filter(|g| {
                g.minor == third.minor || Path::new(&format!("/dev/nvidia{}", g.minor)).exists()
            })
            .map(|g| g.uuid.as_str())
            .collect();
        let uuids: Vec<&str> = visible.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, expected);
        assert!(uuids.contains(&third.uuid.as_str()));
        for (index, gpu) in visible.gpus.iter().enumerate() {
            assert_eq!(gpu.index, index as u32);
        }
    }

    #[test]
    fn of_a_mig_gpu_only_mig_devices_with_both_capability_nodes_are_visible() {
        let inventory = tessera_gpu_inventory::MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.mig.as_ref().is_some_and(|m| m.instances.len() >= 2))
            .unwrap();
        let instances = &gpu.mig.as_ref().unwrap().instances;
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev/nvidia-caps")).unwrap();
        std::fs::write(root.path().join(format!("dev/nvidia{}", gpu.minor)), b"").unwrap();
        let give = |gi: u32, ci: Option<u32>| {
            let cap = standard_mig_cap_minor(gpu.minor, gi, ci).unwrap();
            std::fs::write(root.path().join(cap_node(cap).trim_start_matches('/')), b"").unwrap();
        };
        // The first device gets both of its nodes; the second only its GPU instance's.
        give(instances[0].gpu_instance_id, None);
        give(
            instances[0].gpu_instance_id,
            Some(instances[0].compute_instance_id),
        );
        give(instances[1].gpu_instance_id, None);
        let visible = visible_inventory(inventory.clone(), Some(root.path()));
        let seen = visible
            .gpus
            .iter()
            .find(|g| g.uuid == gpu.uuid)
            .and_then(|g| g.mig.as_ref())
            .map(|m| {
                m.instances
                    .iter()
                    .map(|i| i.uuid.as_str())
                    .collect::<Vec<_>>()
            })
            .unwrap();
        assert_eq!(seen, vec![instances[0].uuid.as_str()]);
    }
}
