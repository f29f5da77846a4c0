//! The NVIDIA driver's device nodes: names, and the MIG capability minors' standard layout.
//!
//! ```text
//! /dev/nvidia<minor>                  one per GPU (the GPU's device minor)
//! /dev/nvidiactl                      the driver's control node
//! /dev/nvidia-uvm, nvidia-uvm-tools   unified memory
//! /dev/nvidia-caps/nvidia-cap<N>      capabilities: 1 = MIG config, 2 = MIG monitor,
//!                                     then one per MIG GPU instance and compute instance
//! ```
//!
//! The driver lists the capability minors in `/proc/driver/nvidia-caps/mig-minors`; their order
//! is fixed (per GPU minor, per GPU instance id `0..15`: the GPU instance's `access` capability,
//! then compute instances `0..8`), which [`standard_mig_cap_minor`] computes for nodes without
//! the file (mock GPUs).

/// Driver-wide device nodes every container with a GPU gets, in the order they are injected.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The MIG configuration capability (`/proc/driver/nvidia/capabilities/mig/config`).
pub const MIG_CONFIG_CAP_MINOR: u32 = 1;
/// The MIG monitoring capability (`/proc/driver/nvidia/capabilities/mig/monitor`).
pub const MIG_MONITOR_CAP_MINOR: u32 = 2;

/// GPU instance ids per GPU in the standard layout.
pub const GPU_INSTANCES_PER_GPU: u32 = 15;
/// Compute instance ids per GPU instance in the standard layout.
pub const COMPUTE_INSTANCES_PER_GPU_INSTANCE: u32 = 8;
const FIRST_INSTANCE_MINOR: u32 = 3;

/// `/dev/nvidia<minor>`.
pub fn gpu_node(minor: u32) -> String {
    format!("/dev/nvidia{minor}")
}

/// `/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_node(minor: u32) -> String {
    format!("/dev/nvidia-caps/nvidia-cap{minor}")
}

/// The capability minor of GPU instance `gi` (`ci: None`) or of its compute instance `ci` on the
/// GPU with device minor `gpu_minor`, in the driver's standard layout; `None` past its ranges.
pub fn standard_mig_cap_minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
    if gi >= GPU_INSTANCES_PER_GPU || ci.is_some_and(|ci| ci >= COMPUTE_INSTANCES_PER_GPU_INSTANCE)
    {
        return None;
    }
    let per_gi = 1 + COMPUTE_INSTANCES_PER_GPU_INSTANCE;
    let base = FIRST_INSTANCE_MINOR.checked_add(
        gpu_minor
            .checked_mul(GPU_INSTANCES_PER_GPU)?
            .checked_add(gi)?
            .checked_mul(per_gi)?,
    )?;
    base.checked_add(ci.map_or(0, |ci| ci + 1))
}

/// Every capability minor of GPU minor `gpu_minor` in the standard layout (GPU and compute
/// instances of all ids).
pub fn standard_mig_cap_minors(gpu_minor: u32) -> impl Iterator<Item = u32> {
    (0..GPU_INSTANCES_PER_GPU).flat_map(move |gi| {
        std::iter::once(None)
            .chain((0..COMPUTE_INSTANCES_PER_GPU_INSTANCE).map(Some))
            .filter_map(move |ci| standard_mig_cap_minor(gpu_minor, gi, ci))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_layout_is_dense_and_starts_after_the_mig_capabilities() {
        assert_eq!(standard_mig_cap_minor(0, 0, None), Some(3));
        assert_eq!(standard_mig_cap_minor(0, 0, Some(0)), Some(4));
        assert_eq!(standard_mig_cap_minor(0, 1, None), Some(12));
        assert_eq!(standard_mig_cap_minor(1, 0, None), Some(3 + 15 * 9));
        assert_eq!(standard_mig_cap_minor(0, 15, None), None);
        assert_eq!(standard_mig_cap_minor(0, 0, Some(8)), None);
        let gpu0: Vec<u32> = standard_mig_cap_minors(0).collect();
        assert_eq!(gpu0.len(), 135);
        assert_eq!(gpu0.first(), Some(&3));
        assert_eq!(gpu0.last(), Some(&137));
        assert_eq!(standard_mig_cap_minors(1).next(), Some(138));
        assert_eq!(gpu_node(3), "/dev/nvidia3");
        assert_eq!(cap_node(12), "/dev/nvidia-caps/nvidia-cap12");
    }
}
