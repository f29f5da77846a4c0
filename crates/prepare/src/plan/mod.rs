//! The prepare plan: a pure function from a ResourceClaim (as the API server has it), the node's
//! inventory and the node name to the [`ClaimRecord`] the driver records as `PrepareStarted`
//! before its first side effect. No IO: everything the plan needs is passed in.
//!
//! The plan decides which allocation results are ours (driver `gpu.tessera.dev`, pool = this
//! node), what hardware each device name stands for ([`GpuInventory::resolve_device`]), the
//! effective opaque configuration of each device ([`config`]), the CDI device ids handed to the
//! kubelet, and where the claim's MPS daemon lives. Bad input is a [`PlanError`] naming the
//! result or config at fault.

mod config;
mod error;

use std::path::Path;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use tessera_api::DRIVER_NAME;
use tessera_api::config::{Sharing, SharingStrategy, TimeSliceInterval};
use tessera_api::imex;
use tessera_api::names::capacity;
use tessera_gpu_inventory::{Gpu, GpuInventory, MigInstance, MigProfile, ResolvedDevice};
use tessera_kubelet_grpc::ClaimRef;

pub use config::translation_notes;
pub use error::{ConfigSource, PlanError};

use error::config_label;

use crate::cdi_spec;
use crate::checkpoint::{
    ClaimRecord, ClaimState, DeviceRecord, DeviceShare, DeviceTarget, ImexRecord,
    MigInstanceRecord, MigLifecycle, MpsRecord,
};

/// How MIG devices are managed on this node; must match how the publisher renders them
/// (`RenderOptions::dynamic_mig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigMode {
    /// MIG devices are the instances that exist on the GPU; the plugin uses them as they are.
    Static,
    /// MIG devices are placements: the plugin creates the instance on prepare and destroys it
    /// on unprepare. The plugin owns every MIG instance of a MIG-enabled GPU.
    Dynamic,
}

/// What the plan needs besides the claim.
#[derive(Debug, Clone, Copy)]
pub struct PlanContext<'a> {
    /// This node's name: the name of the pool whose devices this plugin prepares.
    pub node_name: &'a str,
    /// The node's GPUs.
    pub inventory: &'a GpuInventory,
    /// Static or dynamic MIG.
    pub mig_mode: MigMode,
    /// Where per-claim MPS directories go (`<mps root>/<claim uid>/{pipe,log}`), on the host.
    pub mps_root: &'a Path,
    /// The number of equal shares each device is published with (`--consumable-shares=N`).
    pub total_shares: Option<u32>,
    /// Where per-claim IMEX directories go (`<imex root>/<claim uid>`), on the host.
    pub imex_root: &'a Path,
}

/// Plans the preparation of `claim`: checks it is the claim the kubelet asked for and allocated
/// to this node, resolves every device of this driver, applies the opaque configs, and returns
/// the record to write as `PrepareStarted`. Dynamic MIG devices have no instance yet.
pub fn plan_claim(
    claim: &ResourceClaim,
    asked: &ClaimRef,
    context: PlanContext<'_>,
) -> Result<ClaimRecord, PlanError> {
    let found_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if found_uid != asked.uid.as_str() {
        return Err(PlanError::UidMismatch {
            expected: asked.uid.to_string(),
            found: found_uid.to_owned(),
        });
    }
    let whole_allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or(PlanError::NotAllocated)?;
    if let Some(selector) = &whole_allocation.node_selector {
        check_node_selector(selector, context.node_name)?;
    }
    let allocation = whole_allocation
        .devices
        .as_ref()
        .ok_or(PlanError::NotAllocated)?;
    let (channels, results): (Vec<_>, Vec<_>) = allocation
        .results
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, r)| r.driver == DRIVER_NAME)
        .partition(|(_, r)| imex::clique_of_pool(&r.pool).is_some());
    if results.is_empty() && channels.is_empty() {
        return Err(PlanError::NoDevicesOfDriver);
    }
    let imex = imex_record(&channels, asked.uid.as_str(), context.imex_root)?;
    let mut devices = Vec::with_capacity(results.len());
    let mut memories = Vec::with_capacity(results.len());
    for &(index, result) in &results {
        let (device, memory_bytes) = resolve_result(index, result, asked.uid.as_str(), context)?;
        devices.push(device);
        memories.push(memory_bytes);
    }
    if !devices.is_empty() {
        apply_configs(allocation, &results, &memories, &mut devices)?;
    }
    let mps = mps_record(&devices, asked.uid.as_str(), context.mps_root)?;
    Ok(ClaimRecord {
        namespace: asked.namespace.clone(),
        name: asked.name.clone(),
        state: ClaimState::PrepareStarted,
        devices,
        mps,
        imex,
    })
}

/// Applies the opaque configs (class, then claim) to the claim's GPU and MIG devices.
fn apply_configs(
    allocation: &k8s_openapi::api::resource::v1::DeviceAllocationResult,
    results: &[(usize, &DeviceRequestAllocationResult)],
    memories: &[u64],
    devices: &mut [DeviceRecord],
) -> Result<(), PlanError> {
    let nvidia_devices = allocation
        .results
        .iter()
        .flatten()
        .any(|r| r.driver == tessera_api::nvidia::NVIDIA_DRIVER_NAME);
    let configs = config::decode_configs(
        allocation.config.as_deref().unwrap_or_default(),
        nvidia_devices,
    )?;
    let effective = config::effective_configs(&configs, devices)?;
    for (((device, config), &(_, result)), &memory_bytes) in
        devices.iter_mut().zip(effective).zip(results).zip(memories)
    {
        // Admin access observes a device another claim uses: never reconfigure it.
        if result.admin_access != Some(true) {
            device.sharing = config.and_then(|c| c.sharing().cloned());
        }
        check_sharing(device, memory_bytes)?;
    }
    Ok(())
}

/// The claim's IMEX channel: at most one (a claim is one domain), a device of a channel pool.
fn imex_record(
    channels: &[(usize, &DeviceRequestAllocationResult)],
    claim_uid: &str,
    imex_root: &Path,
) -> Result<Option<ImexRecord>, PlanError> {
    let Some(&(index, result)) = channels.first() else {
        return Ok(None);
    };
    if let Some(&(_, second)) = channels.get(1) {
        return Err(PlanError::SeveralImexChannels {
            first: result.device.clone(),
            second: second.device.clone(),
        });
    }
    let channel =
        imex::channel_of_device(&result.device).ok_or_else(|| PlanError::UnknownDevice {
            index,
            request: result.request.clone(),
            device: result.device.clone(),
        })?;
    let directory = crate::paths::child(imex_root, claim_uid)?;
    Ok(Some(ImexRecord {
        request: result.request.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
        cdi_device_ids: vec![cdi_spec::device_id(claim_uid, &result.device)],
        channel,
        clique: imex::clique_of_pool(&result.pool)
            .unwrap_or_default()
            .to_owned(),
        directory: directory.to_string_lossy().into_owned(),
    }))
}

fn resolve_result(
    index: usize,
    result: &DeviceRequestAllocationResult,
    claim_uid: &str,
    context: PlanContext<'_>,
) -> Result<(DeviceRecord, u64), PlanError> {
    if result.pool != context.node_name {
        return Err(PlanError::ForeignPool {
            index,
            request: result.request.clone(),
            device: result.device.clone(),
            pool: result.pool.clone(),
            node: context.node_name.to_owned(),
        });
    }
    let unknown = || PlanError::UnknownDevice {
        index,
        request: result.request.clone(),
        device: result.device.clone(),
    };
    let resolved = context
        .inventory
        .resolve_device(&result.device)
        .ok_or_else(unknown)?;
    let memory_bytes = match &resolved {
        ResolvedDevice::Gpu(gpu) => gpu.memory_bytes,
        ResolvedDevice::Mig { profile, .. } => profile.memory_bytes,
    };
    let target = match resolved {
        ResolvedDevice::Gpu(gpu) => DeviceTarget::Gpu {
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
        },
        ResolvedDevice::Mig {
            gpu,
            profile,
            placement_start,
            instance,
        } => {
            let at = MigPlacement {
                gpu,
                profile,
                placement_start,
                instance,
            };
            mig_target(result, at, context.mig_mode)?
        }
    };
    let record = DeviceRecord {
        request: result.request.clone(),
        pool: result.pool.clone(),
        device: result.device.clone(),
        cdi_device_ids: vec![cdi_spec::device_id(claim_uid, &result.device)],
        target,
        sharing: None,
        share: device_share(result, context.total_shares),
    };
    Ok((record, memory_bytes))
}

/// What a MIG device name resolved to ([`ResolvedDevice::Mig`]).
struct MigPlacement<'a> {
    gpu: &'a Gpu,
    profile: &'a MigProfile,
    placement_start: u32,
    instance: Option<&'a MigInstance>,
}

/// The record of a MIG device: dynamic (created at prepare) when the node creates MIG
/// devices on demand and the result is not admin access, else static (the instance must exist).
fn mig_target(
    result: &DeviceRequestAllocationResult,
    at: MigPlacement<'_>,
    mig_mode: MigMode,
) -> Result<DeviceTarget, PlanError> {
    let MigPlacement {
        gpu,
        profile,
        placement_start,
        instance,
    } = at;
    let instance = instance.map(|i| MigInstanceRecord {
        uuid: i.uuid.clone(),
        gpu_instance_id: i.gpu_instance_id,
        compute_instance_id: i.compute_instance_id,
    });
    let lifecycle = match mig_mode {
        // Admin access never creates what the device's real user would own.
        MigMode::Dynamic if result.admin_access != Some(true) => MigLifecycle::Dynamic,
        _ => MigLifecycle::Static,
    };
    match lifecycle {
        MigLifecycle::Static if instance.is_none() => {
            return Err(PlanError::MigInstanceMissing {
                device: result.device.clone(),
                gpu_uuid: gpu.uuid.clone(),
            });
        }
        MigLifecycle::Dynamic if !gpu.mig_enabled() => {
            return Err(PlanError::MigModeDisabled {
                device: result.device.clone(),
                gpu_uuid: gpu.uuid.clone(),
            });
        }
        _ => {}
    }
    Ok(DeviceTarget::Mig {
        parent_uuid: gpu.uuid.clone(),
        parent_minor: gpu.minor,
        profile: profile.name.clone(),
        placement_start,
        lifecycle,
        // A dynamic device gets its instance when prepare creates (or adopts) it.
        instance: match lifecycle {
            MigLifecycle::Static => instance,
            MigLifecycle::Dynamic => None,
        },
    })
}

/// The claim's part of a shared device: what its result says it consumed. A result without a
/// `shareID` is a device allocated whole.
fn device_share(
    result: &DeviceRequestAllocationResult,
    total_shares: Option<u32>,
) -> Option<DeviceShare> {
    let share_id = result.share_id.clone()?;
    let consumed = |name: &str| {
        result
            .consumed_capacity
            .as_ref()?
            .get(name)
            .and_then(|q| tessera_api::config::quantity_bytes(&q.0).ok())
    };
    let shares = consumed(capacity::SHARES);
    Some(DeviceShare {
        share_id,
        memory_bytes: consumed(capacity::MEMORY),
        shares,
        total_shares: shares.and(total_shares.map(u64::from)),
    })
}

/// Refuses sharing settings the device cannot honour: a time-slice length on a MIG device, an
/// MPS pinned-memory limit beyond the device's memory (`memory_bytes`).
fn check_sharing(device: &DeviceRecord, memory_bytes: u64) -> Result<(), PlanError> {
    let Some(sharing) = &device.sharing else {
        return Ok(());
    };
    if let Some(mps) = &sharing.mps
        && let Some(limit) = mps.pinned_memory_limit_bytes(&device.device)
        && memory_bytes > 0
        && limit > memory_bytes
    {
        let field = if mps
            .per_device_pinned_memory_limit
            .contains_key(&device.device)
        {
            format!("sharing.mps.perDevicePinnedMemoryLimit.{}", device.device)
        } else {
            "sharing.mps.defaultPinnedDeviceMemoryLimit".to_owned()
        };
        return Err(PlanError::PinnedMemoryBeyondDevice {
            device: device.device.clone(),
            field,
            limit_mib: limit >> 20,
            memory_mib: memory_bytes >> 20,
        });
    }
    if let (DeviceTarget::Mig { .. }, Some(time_slicing)) =
        (&device.target, sharing.time_slicing.as_ref())
        && time_slicing.interval != TimeSliceInterval::Default
    {
        return Err(PlanError::TimeSliceIntervalOnMig {
            device: device.device.clone(),
            interval: time_slicing.interval,
        });
    }
    Ok(())
}

/// Refuses an allocation whose node selector rules this node out by name. The selector's terms
/// are alternatives; a term rules this node out when one of its `matchFields` requirements on
/// `metadata.name` does (what the scheduler writes: `metadata.name In [node]`). A term that
/// selects by labels only cannot be judged without the node's labels and does not refuse.
fn check_node_selector(selector: &NodeSelector, node: &str) -> Result<(), PlanError> {
    let rules_out = |term: &NodeSelectorTerm| {
        term.match_fields
            .iter()
            .flatten()
            .filter(|r| r.key == "metadata.name")
            .find(|r| r.operator == "In" && !r.values.iter().flatten().any(|v| v == node))
            .map(|r| {
                r.values
                    .iter()
                    .flatten()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            })
    };
    let verdicts: Vec<Option<String>> =
        selector.node_selector_terms.iter().map(rules_out).collect();
    if verdicts.is_empty() || verdicts.iter().any(Option::is_none) {
        return Ok(());
    }
    Err(PlanError::ForeignNode {
        selected: verdicts
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" or "),
        node: node.to_owned(),
    })
}

fn mps_settings(sharing: &Sharing) -> Option<u8> {
    sharing
        .mps
        .as_ref()
        .and_then(|m| m.default_active_thread_percentage)
}

fn mps_record(
    devices: &[DeviceRecord],
    claim_uid: &str,
    mps_root: &Path,
) -> Result<Option<MpsRecord>, PlanError> {
    let mut first: Option<(&DeviceRecord, Option<u8>)> = None;
    for device in devices {
        let Some(sharing) = device
            .sharing
            .as_ref()
            .filter(|s| s.strategy == SharingStrategy::Mps)
        else {
            continue;
        };
        let settings = mps_settings(sharing);
        match first {
            None => first = Some((device, settings)),
            Some((other, other_settings)) if other_settings != settings => {
                return Err(PlanError::MpsSettingsConflict {
                    first: other.device.clone(),
                    second: device.device.clone(),
                });
            }
            Some(_) => {}
        }
    }
    if first.is_none() {
        return Ok(None);
    }
    let dir = crate::paths::child(mps_root, claim_uid)?;
    Ok(Some(MpsRecord {
        pipe_directory: dir.join("pipe").to_string_lossy().into_owned(),
        log_directory: dir.join("log").to_string_lossy().into_owned(),
    }))
}

#[cfg(test)]
mod tests;
