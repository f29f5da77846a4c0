//! What a plugin process left on disk, checked against its checkpoint: shared by the crash
//! tests (random kills and named crash points).

use std::collections::BTreeSet;
use std::path::Path;

use tessera_api::config::{SharingStrategy, TimeSliceInterval};
use tessera_gpu_inventory::GpuInventory;
use tessera_prepare::checkpoint::quarantined_files;
use tessera_prepare::checkpoint::{self, Checkpoint, ClaimState, DeviceTarget, MigLifecycle};
use tessera_prepare::mig::SimulatedMig;
use tessera_prepare::sharing::SimulatedGpuControl;

/// Checks that what is on disk agrees with the checkpoint in `state`, and the checkpoint with
/// what the kubelet was told (`prepared`) — except for the claims of an interrupted call
/// (`in_flight`), which must be either wholly prepared or wholly gone. Between calls every
/// record is `PrepareCompleted`, and every CDI spec, MPS daemon, time slice and dynamic MIG
/// instance belongs to a recorded claim that has all of them. Returns the first disagreement.
pub fn check_node_state(
    state: &Path,
    cdi: &Path,
    inventory: &GpuInventory,
    prepared: &BTreeSet<String>,
    in_flight: &BTreeSet<String>,
) -> Result<(), String> {
    let bytes = std::fs::read(state.join("checkpoint.json"))
        .map_err(|e| format!("the checkpoint cannot be read: {e}"))?;
    let loaded =
        checkpoint::decode(&bytes).map_err(|e| format!("the checkpoint does not load: {e}"))?;
    let quarantined = quarantined_files(state);
    if !quarantined.is_empty() {
        return Err(format!("a checkpoint was quarantined: {quarantined:?}"));
    }
    let recorded: BTreeSet<String> = loaded.claims.keys().map(ToString::to_string).collect();
    for (uid, record) in &loaded.claims {
        if record.state != ClaimState::PrepareCompleted {
            return Err(format!("{uid} is left {} between calls", record.state));
        }
    }
    for uid in recorded.symmetric_difference(prepared) {
        if !in_flight.contains(uid) {
            return Err(format!(
                "checkpoint {recorded:?} vs prepared as the kubelet knows {prepared:?}: {uid}"
            ));
        }
    }

    let specs = spec_uids(cdi);
    if specs != recorded {
        return Err(format!(
            "CDI specs {specs:?} vs recorded claims {recorded:?}"
        ));
    }

    let gpu = SimulatedGpuControl::new(state.join("simulated-gpu"));
    check_daemons(&gpu, &loaded)?;

    let leftovers = gpu.leftover_files();
    if !leftovers.is_empty() {
        return Err(format!("simulated GPU state left behind: {leftovers:?}"));
    }

    check_time_slices(&gpu, &loaded, inventory)?;

    check_mig_instances(state, inventory, &loaded)
}

/// Every recorded claim with MPS, and no other, has a daemon running.
fn check_daemons(gpu: &SimulatedGpuControl, loaded: &Checkpoint) -> Result<(), String> {
    let daemons: BTreeSet<String> = gpu
        .running_daemons()
        .into_iter()
        .map(|d| d.claim_uid)
        .collect();
    let wanted_daemons: BTreeSet<String> = loaded
        .claims
        .iter()
        .filter(|(_, r)| r.mps.is_some())
        .map(|(uid, _)| uid.to_string())
        .collect();
    if daemons != wanted_daemons {
        return Err(format!(
            "MPS daemons for {daemons:?}, recorded MPS claims {wanted_daemons:?}"
        ));
    }
    Ok(())
}

/// Every GPU a recorded claim time-slices, and no other, has a time slice set.
fn check_time_slices(
    gpu: &SimulatedGpuControl,
    loaded: &Checkpoint,
    inventory: &GpuInventory,
) -> Result<(), String> {
    let sliced: BTreeSet<String> = loaded
        .claims
        .values()
        .flat_map(|r| &r.devices)
        .filter(|d| {
            d.sharing
                .as_ref()
                .is_some_and(|s| s.strategy == SharingStrategy::TimeSlicing)
        })
        .map(|d| d.target.gpu_uuid().to_owned())
        .collect();
    for g in &inventory.gpus {
        let set = gpu.time_slice(&g.uuid) != TimeSliceInterval::Default;
        if set != sliced.contains(&g.uuid) {
            return Err(format!(
                "GPU {} time slice {:?}, recorded time-sliced GPUs {sliced:?}",
                g.uuid,
                gpu.time_slice(&g.uuid)
            ));
        }
    }
    Ok(())
}

/// Every dynamic MIG instance a recorded claim holds, and no other, exists; a dynamic MIG device
/// is never recorded without its instance.
fn check_mig_instances(
    state: &Path,
    inventory: &GpuInventory,
    loaded: &Checkpoint,
) -> Result<(), String> {
    let mig = SimulatedMig::persistent(inventory, state.join("simulated-mig.json"));
    let mut instances: Vec<String> = mig
        .all_instances()
        .into_values()
        .flatten()
        .map(|i| i.uuid)
        .collect();
    instances.sort();
    let mut wanted_instances: Vec<String> = Vec::new();
    for (uid, record) in &loaded.claims {
        for device in &record.devices {
            if let DeviceTarget::Mig {
                lifecycle: MigLifecycle::Dynamic,
                instance,
                ..
            } = &device.target
            {
                match instance {
                    Some(instance) => wanted_instances.push(instance.uuid.clone()),
                    None => {
                        return Err(format!(
                            "{uid}: {} is prepared without its MIG instance",
                            device.device
                        ));
                    }
                }
            }
        }
    }
    wanted_instances.sort();
    if instances != wanted_instances {
        return Err(format!(
            "MIG instances {instances:?}, recorded {wanted_instances:?}"
        ));
    }
    Ok(())
}

/// The claim UIDs with a CDI spec (temporary files a kill left are not specs: the runtime
/// reads only `*.json` and `*.yaml`, and they are removed at a start once stale).
pub fn spec_uids(cdi: &Path) -> BTreeSet<String> {
    std::fs::read_dir(cdi)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("gpu.tessera.dev-claim_")?
                .strip_suffix(".json")
                .map(str::to_owned)
        })
        .collect()
}
