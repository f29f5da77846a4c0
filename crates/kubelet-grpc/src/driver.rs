//! The driver trait and the domain types it speaks: what a DRA driver implements so that this
//! crate can serve it to the kubelet.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

/// The UID of a ResourceClaim (`metadata.uid`): the key of every per-claim result.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimUid(String);

impl ClaimUid {
    /// Wraps a claim UID. The gRPC layer never passes an empty UID to a driver.
    pub fn new(uid: impl Into<String>) -> Self {
        Self(uid.into())
    }

    /// The UID as the API server spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClaimUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ClaimUid {
    fn from(uid: &str) -> Self {
        Self::new(uid)
    }
}

impl From<String> for ClaimUid {
    fn from(uid: String) -> Self {
        Self(uid)
    }
}

/// A ResourceClaim the kubelet asks a driver to prepare or unprepare.
///
/// The kubelet sends only the claim's identity; the driver reads the claim (and its allocation)
/// from the API server and must fail the claim if the UID there differs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    /// `metadata.namespace`; never empty when it reaches a driver.
    pub namespace: String,
    /// `metadata.name`; never empty when it reaches a driver.
    pub name: String,
    /// `metadata.uid`; never empty, and unique within one call.
    pub uid: ClaimUid,
}

impl ClaimRef {
    /// A claim reference from its namespace, name and UID.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<ClaimUid>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

impl fmt::Display for ClaimRef {
    /// `namespace/name (uid)`, the form every per-claim message uses.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One device a prepared claim hands to the container runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PreparedDevice {
    /// The claim's requests this device serves. A subrequest suffix (`req/sub`) is stripped by
    /// the gRPC layer, as the kubelet expects. Empty means: all requests of the claim.
    pub request_names: Vec<String>,
    /// The pool that holds the device (for Tessera: the node name).
    pub pool_name: String,
    /// The device name within the pool.
    pub device_name: String,
    /// Fully qualified CDI device ids (`vendor/class=name`) the runtime injects.
    pub cdi_device_ids: Vec<String>,
    /// The share id of a consumable-capacity allocation. Sent over `v1.DRAPlugin` only:
    /// `v1beta1.DRAPlugin` has no field for it.
    pub share_id: Option<String>,
}

/// The outcome of preparing one claim: its devices, or an error naming the claim and the
/// problem (the kubelet shows its text in pod events). `E` is the driver's error type
/// ([`DraDriver::Error`]); the gRPC layer turns it into text.
pub type PrepareResult<E = String> = Result<Vec<PreparedDevice>, E>;

/// The outcome of unpreparing one claim: success or an error naming the claim.
pub type UnprepareResult<E = String> = Result<(), E>;

/// Health of one device as the driver last determined it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    /// The health cannot be determined.
    #[default]
    Unknown,
    /// The device works normally.
    Healthy,
    /// The device reported a problem.
    Unhealthy,
}

/// The health of one of the driver's devices, streamed to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The pool that holds the device.
    pub pool_name: String,
    /// The device name within the pool.
    pub device_name: String,
    /// The status.
    pub status: HealthStatus,
    /// When the driver determined `status` (sent with one-second resolution).
    pub last_updated: SystemTime,
    /// How long the kubelet trusts this status before it treats it as unknown;
    /// `None` means the kubelet's default.
    pub health_check_timeout: Option<Duration>,
    /// Optional detail, e.g. the XID that made the device unhealthy. The kubelet truncates it
    /// beyond 1024 characters.
    pub message: String,
}

/// What a DRA driver implements; [`crate::PluginConfig::bind`] serves it to the kubelet over
/// `v1.DRAPlugin`, `v1beta1.DRAPlugin` and (when [`DraDriver::device_health`] returns a
/// receiver) the `DRAResourceHealth` stream.
///
/// Contract:
/// - Both calls are batches and must be idempotent: the kubelet repeats calls after timeouts
///   (45 s per call), restarts and errors.
/// - Calls may run concurrently unless [`crate::PluginConfig::serialize_calls`] is on (the
///   default), in which case prepare and unprepare calls run one at a time.
/// - Each claim UID appears once per call, with non-empty namespace, name and UID; malformed
///   requests are answered by the gRPC layer and never reach the driver.
/// - The returned map should hold one entry per claim passed in. The gRPC layer turns a
///   missing entry into an error for that claim and drops entries for claims not asked for.
/// - A panic inside a call is caught and reported to the kubelet as an `INTERNAL` status for
///   the whole batch; it does not take the plugin down.
pub trait DraDriver: Send + Sync + 'static {
    /// Why one claim failed. Kept typed up to the gRPC layer, which sends its text to the
    /// kubelet, cut to [`crate::MAX_CLAIM_ERROR_BYTES`].
    type Error: fmt::Display + Send + 'static;

    /// Prepares a batch of claims for containers on this node and returns, per claim UID,
    /// the devices (with their CDI ids) or an error.
    fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> impl Future<Output = BTreeMap<ClaimUid, PrepareResult<Self::Error>>> + Send;

    /// Undoes [`DraDriver::prepare`] for a batch of claims. Unpreparing a claim this driver
    /// never prepared (or already unprepared) succeeds.
    fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> impl Future<Output = BTreeMap<ClaimUid, UnprepareResult<Self::Error>>> + Send;

    /// The driver's device health: a watch channel holding the complete list of the driver's
    /// devices on this node, replaced whenever a status changes. Called once, when the plugin
    /// is bound; `None` (the default) means the plugin does not offer the health service.
    ///
    /// Every kubelet stream receives the current list at once and then each new one. Keep the
    /// sender alive: when it is dropped, open streams end and the kubelet reconnects.
    fn device_health(&self) -> Option<watch::Receiver<Vec<DeviceHealth>>> {
        None
    }
}
