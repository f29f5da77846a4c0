//! What the plan says when a claim cannot be prepared, and how it names configs and devices in
//! those messages (below `config` and the planner, which both report through it).

use std::fmt;

use tessera_api::DRIVER_NAME;
use tessera_api::config::{ConfigError, TimeSliceInterval};

use crate::checkpoint::DeviceTarget;

/// Where an allocation config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigSource {
    /// A DeviceClass's `spec.config`.
    FromClass,
    /// The claim's `spec.devices.config`.
    FromClaim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigSource::FromClass => "DeviceClass",
            ConfigSource::FromClaim => "claim",
        })
    }
}

/// Why a claim cannot be prepared on this node. The message says what is wrong and where;
/// the driver prefixes it with the claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The claim's UID cannot name its MPS directory.
    #[error("the claim's UID cannot name its MPS directory: {0}")]
    UnsafeUid(#[from] crate::paths::UnsafeName),
    /// The API server's claim is another object with the same name.
    #[error(
        "the claim in the API server has UID {found}, not {expected}: it was deleted and \
         re-created; the kubelet will prepare the new claim for the new pod"
    )]
    UidMismatch { expected: String, found: String },
    /// `status.allocation.nodeSelector` selects nodes by name, and not this one.
    #[error(
        "the claim is allocated to node {selected} (status.allocation.nodeSelector), not to this \
         node ({node}); only that node may prepare it"
    )]
    ForeignNode { selected: String, node: String },
    /// `status.allocation` is empty.
    #[error(
        "the claim is not allocated (status.allocation is empty); it must be allocated before its pod starts"
    )]
    NotAllocated,
    /// The allocation holds no device of this driver.
    #[error("the allocation holds no device of driver {DRIVER_NAME}")]
    NoDevicesOfDriver,
    /// A result of this driver names another node's pool.
    #[error(
        "allocation result {index} (request `{request}`) is device `{device}` of pool `{pool}`, \
         but this node's pool is `{node}`: the claim is allocated to another node"
    )]
    ForeignPool {
        index: usize,
        request: String,
        device: String,
        pool: String,
        node: String,
    },
    /// A claim holds two IMEX channels: a claim is one domain, with one channel.
    #[error(
        "the claim holds IMEX channels `{first}` and `{second}`; a claim is one IMEX domain with \
         one channel: ask for count 1 of class imex.gpu.tessera.dev"
    )]
    SeveralImexChannels { first: String, second: String },
    /// A result names a device this node does not have.
    #[error(
        "allocation result {index} (request `{request}`) names device `{device}`, which this node \
         does not have (its devices are `gpu-<minor>` and `gpu-<minor>-mig-<profile>-<start>`); \
         the ResourceSlice it was allocated from is stale"
    )]
    UnknownDevice {
        index: usize,
        request: String,
        device: String,
    },
    /// Static MIG: the instance the device names no longer exists.
    #[error(
        "MIG device `{device}` no longer exists on GPU {gpu_uuid} (static MIG: the plugin does not \
         create instances); recreate the MIG instance or reallocate the claim"
    )]
    MigInstanceMissing { device: String, gpu_uuid: String },
    /// Dynamic MIG on a GPU whose MIG mode is off.
    #[error(
        "MIG device `{device}` cannot be created: MIG mode is disabled on GPU {gpu_uuid}; enable it with `nvidia-smi -i {gpu_uuid} -mig 1`"
    )]
    MigModeDisabled { device: String, gpu_uuid: String },
    /// A config entry is not `FromClass` or `FromClaim`.
    #[error(
        "allocation config {index} has source `{source_name}`; expected `FromClass` or `FromClaim`"
    )]
    UnknownConfigSource { index: usize, source_name: String },
    /// A config's parameters are not a valid Tessera configuration.
    #[error(
        "{}: {error}",
        config_label(*source_kind, *index, requests)
    )]
    InvalidConfig {
        index: usize,
        source_kind: ConfigSource,
        requests: Vec<String>,
        error: ConfigError,
    },
    /// A config names a request whose device is of the other type.
    #[error(
        "{} has kind {kind}, which configures {fits} devices, but it names \
         request `{request}` whose device `{device}` is a {device_type} device; use kind {wanted}",
        config_name(*source_kind, *index)
    )]
    WrongConfigKind {
        index: usize,
        source_kind: ConfigSource,
        kind: &'static str,
        fits: &'static str,
        request: String,
        device: String,
        device_type: &'static str,
        wanted: &'static str,
    },
    /// A config applies to no allocated device of its kind.
    #[error(
        "{} of kind {kind} applies to no allocated {fits} \
         device of this claim; remove it or name the requests it is meant for",
        config_label(*source_kind, *index, requests)
    )]
    ConfigAppliesToNothing {
        index: usize,
        source_kind: ConfigSource,
        kind: &'static str,
        fits: &'static str,
        requests: Vec<String>,
    },
    /// Time-slice lengths are a whole-GPU setting.
    #[error(
        "device `{device}` is a MIG device, whose time slice cannot be set: remove \
         `sharing.timeSlicing.interval` (or set it to `Default`) for MIG devices"
    )]
    TimeSliceIntervalOnMig {
        device: String,
        interval: TimeSliceInterval,
    },
    /// One MPS daemon serves all MPS devices of a claim: their daemon-wide settings must agree.
    #[error(
        "devices `{first}` and `{second}` are shared with MPS by one daemon but ask for different \
         `sharing.mps.defaultActiveThreadPercentage`; use one value per claim"
    )]
    MpsSettingsConflict { first: String, second: String },
    /// An MPS pinned-memory limit larger than the device's memory.
    #[error(
        "`{field}` is {limit_mib}Mi, more than device `{device}` has ({memory_mib}Mi); use at \
         most {memory_mib}Mi, or remove the field for no limit"
    )]
    PinnedMemoryBeyondDevice {
        device: String,
        field: String,
        limit_mib: u64,
        memory_mib: u64,
    },
}

/// A config as its author wrote it: a claim's `spec.devices.config[i]` (`index` counts the
/// claim's own entries, which the allocator copies in order after the classes'), or the
/// `index`-th DeviceClass config of the allocation; with the requests it names.
pub(crate) fn config_label(source: ConfigSource, index: usize, requests: &[String]) -> String {
    let requests = if requests.is_empty() {
        "for every request".to_owned()
    } else {
        let names: Vec<String> = requests.iter().map(|r| format!("`{r}`")).collect();
        format!(
            "for request{} {}",
            if names.len() == 1 { "" } else { "s" },
            names.join(", ")
        )
    };
    format!("{} ({requests})", config_name(source, index))
}

/// [`config_label`] without the requests.
pub(crate) fn config_name(source: ConfigSource, index: usize) -> String {
    match source {
        ConfigSource::FromClaim => format!("claim config spec.devices.config[{index}]"),
        ConfigSource::FromClass => format!("DeviceClass config {index} of the allocation"),
    }
}

/// The `type` of a device, as published.
pub(crate) fn device_type(target: &DeviceTarget) -> &'static str {
    match target {
        DeviceTarget::Gpu { .. } => tessera_api::names::device_type::GPU,
        DeviceTarget::Mig { .. } => tessera_api::names::device_type::MIG,
    }
}
