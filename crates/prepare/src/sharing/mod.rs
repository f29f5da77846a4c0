//! GPU sharing from the opaque configs: time slicing and MPS, behind [`GpuControl`].
//!
//! What to do is computed from the claim's record (pure: [`time_slices`], [`mps_daemon`]); how
//! it is done is the [`GpuControl`] implementation's business:
//! - [`SystemGpuControl`]: `nvidia-smi compute-policy --set-timeslice` and one
//!   `nvidia-cuda-mps-control -d` per claim, configured through its control interface (a daemon
//!   that outlives the plugin *process*, not the plugin's pod);
//! - the node plugin's `PodMpsControl`: the same tools, but each claim's MPS daemon in a pod of
//!   its own, which outlives the plugin's pod (rollouts);
//! - [`RecordingGpuControl`]: an in-memory fake that records every call (tests);
//! - [`SimulatedGpuControl`]: keeps the same state in files, so that it survives the plugin
//!   process (mock topologies, crash tests).
//!
//! Every operation is idempotent: starting a running daemon only reapplies its settings,
//! stopping a daemon that is not running succeeds. Recovery relies on this.

mod recording;
mod simulated;
mod system;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tessera_api::config::{SharingStrategy, TimeSliceInterval};
use tessera_api::shares::thread_percentage;
use tessera_kubelet_grpc::ClaimUid;

pub use recording::{GpuCall, GpuOperation, RecordingGpuControl};
pub use simulated::SimulatedGpuControl;
pub use system::SystemGpuControl;

use crate::checkpoint::{ClaimRecord, DeviceTarget};

/// The container-side directory the claim's MPS pipe directory is mounted at.
pub const MPS_PIPE_DIRECTORY_IN_CONTAINER: &str = "/tmp/nvidia-mps";
/// The container-side directory the claim's MPS log directory is mounted at.
pub const MPS_LOG_DIRECTORY_IN_CONTAINER: &str = "/var/log/nvidia-mps";

/// The MPS control daemon of one claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDaemon {
    /// The claim it serves.
    pub claim_uid: String,
    /// Its directories on the host.
    pub directories: MpsDirectories,
    /// The devices it serves (`CUDA_VISIBLE_DEVICES` of the daemon), in claim order.
    pub devices: Vec<MpsDevice>,
    /// `set_default_active_thread_percentage`, if configured.
    pub active_thread_percentage: Option<u8>,
}

/// Where a claim's MPS daemon keeps its pipes and logs (host paths).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MpsDirectories {
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log: PathBuf,
}

/// One device an MPS daemon serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsDevice {
    /// GPU or MIG device UUID.
    pub uuid: String,
    /// `set_default_device_pinned_mem_limit` for this device, in bytes.
    pub pinned_memory_limit_bytes: Option<u64>,
}

/// A sharing operation failed. The reason says what the tool or system answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// Setting a GPU's compute time slice failed.
    #[error("cannot set the time slice of GPU {gpu} to {interval:?}: {reason}")]
    TimeSlice {
        gpu: String,
        interval: TimeSliceInterval,
        reason: String,
    },
    /// Starting (or configuring) a claim's MPS daemon failed.
    #[error("cannot start the MPS daemon of claim {claim_uid} (pipe directory {}): {reason}", pipe.display())]
    StartMps {
        claim_uid: String,
        pipe: PathBuf,
        reason: String,
    },
    /// Stopping a claim's MPS daemon failed.
    #[error("cannot stop the MPS daemon with pipe directory {}: {reason}", pipe.display())]
    StopMps { pipe: PathBuf, reason: String },
}

/// How sharing is put into effect on the node's GPUs.
pub trait GpuControl: Send + Sync {
    /// Sets the compute time slice of the whole GPU `gpu_uuid`.
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), SharingError>;

    /// Starts the MPS control daemon `daemon` and applies its settings. If a daemon already
    /// answers on its pipe directory, only the settings are applied.
    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError>;

    /// Stops the MPS daemon using `directories`; succeeds if none is running.
    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError>;

    /// Claims (by UID) this control runs MPS daemons for that outlive their MPS directories
    /// (daemon pods); recovery stops those no record knows. Default: none.
    fn mps_daemon_claims(&self) -> Result<Vec<ClaimUid>, SharingError> {
        Ok(Vec::new())
    }
}

/// The UUIDs of the whole GPUs a claim's devices are on (a MIG device's parent included).
pub fn gpus_of(record: &ClaimRecord) -> impl Iterator<Item = &str> {
    record.devices.iter().map(|d| match &d.target {
        DeviceTarget::Gpu { uuid, .. } => uuid.as_str(),
        DeviceTarget::Mig { parent_uuid, .. } => parent_uuid.as_str(),
    })
}

/// The time slices a claim sets: one per whole GPU shared with `TimeSlicing`. (MIG devices
/// time-slice with the driver's default; the plan refuses other intervals for them.)
pub fn time_slices(record: &ClaimRecord) -> Vec<(String, TimeSliceInterval)> {
    record
        .devices
        .iter()
        .filter_map(|device| {
            let sharing = device.sharing.as_ref()?;
            let DeviceTarget::Gpu { uuid, .. } = &device.target else {
                return None;
            };
            (sharing.strategy == SharingStrategy::TimeSlicing).then(|| {
                let interval = sharing
                    .time_slicing
                    .as_ref()
                    .map(|t| t.interval)
                    .unwrap_or_default();
                (uuid.clone(), interval)
            })
        })
        .collect()
}

/// The MPS daemon directories of a claim, if it uses MPS.
pub fn mps_directories(record: &ClaimRecord) -> Option<MpsDirectories> {
    record.mps.as_ref().map(|mps| MpsDirectories {
        pipe: PathBuf::from(&mps.pipe_directory),
        log: PathBuf::from(&mps.log_directory),
    })
}

/// The MPS daemon a claim needs, if it uses MPS. Devices without a UUID yet (a dynamic MIG
/// device not created) are left out.
///
/// On a shared device (consumable shares) the claim's part is enforced: the pinned device-memory
/// limit is the memory the claim consumed (or the configured limit if that is lower), and the
/// active thread percentage follows its shares (`100·shares/N`, or the configured percentage if
/// that is lower). A claim that consumed no memory (`unlimited` mode, no request) gets no limit.
pub fn mps_daemon(claim_uid: &str, record: &ClaimRecord) -> Option<MpsDaemon> {
    let directories = mps_directories(record)?;
    let mut active_thread_percentage = None;
    let devices = record
        .devices
        .iter()
        .filter(|d| d.uses_mps())
        .filter_map(|device| {
            let mps = device.sharing.as_ref().and_then(|s| s.mps.as_ref());
            let share = device.share.as_ref();
            let configured = mps.and_then(|m| m.default_active_thread_percentage);
            let from_shares =
                share.and_then(|s| Some(thread_percentage(s.shares?, s.total_shares?)));
            if let Some(pct) = lower(configured, from_shares) {
                active_thread_percentage = Some(pct);
            }
            let consumed = share.and_then(|s| s.memory_bytes).filter(|&b| b > 0);
            Some(MpsDevice {
                uuid: device.target.visible_uuid()?.to_owned(),
                pinned_memory_limit_bytes: lower(
                    mps.and_then(|m| m.pinned_memory_limit_bytes(&device.device)),
                    consumed,
                ),
            })
        })
        .collect();
    Some(MpsDaemon {
        claim_uid: claim_uid.to_owned(),
        directories,
        devices,
        active_thread_percentage,
    })
}

/// The lower of two optional limits.
fn lower<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Puts a claim's sharing into effect (time slices, then the MPS daemon).
pub(crate) fn apply(
    control: &dyn GpuControl,
    claim_uid: &str,
    record: &ClaimRecord,
) -> Result<(), SharingError> {
    for (gpu, interval) in time_slices(record) {
        control.set_time_slice(&gpu, interval)?;
    }
    if let Some(daemon) = mps_daemon(claim_uid, record) {
        control.start_mps(&daemon)?;
    }
    Ok(())
}

/// Undoes a claim's sharing: stops its MPS daemon and puts its GPUs back to the default time
/// slice, except GPUs in `still_used` (UUIDs of GPUs another recorded claim holds, which a shared
/// device has): their time slice is a GPU-wide setting the other claim still runs under. Every
/// step is attempted; the first error is returned (the daemon's, if it could not be stopped).
pub(crate) fn reset(
    control: &dyn GpuControl,
    record: &ClaimRecord,
    still_used: &BTreeSet<String>,
) -> Result<(), SharingError> {
    let mut first_error = None;
    if let Some(directories) = mps_directories(record)
        && let Err(e) = control.stop_mps(&directories)
    {
        first_error.get_or_insert(e);
    }
    for (gpu, interval) in time_slices(record) {
        if interval == TimeSliceInterval::Default || still_used.contains(&gpu) {
            continue;
        }
        if let Err(e) = control.set_time_slice(&gpu, TimeSliceInterval::Default) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
