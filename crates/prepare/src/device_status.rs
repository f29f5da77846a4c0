//! `ResourceClaim.status.devices` (KEP-4817) of a prepared claim: which GPU or MIG device each
//! of its allocated devices is, so that any tool (`kubectl tessera top`, monitoring) can map
//! devices to pods.
//!
//! [`device_statuses`] (pure) turns a prepared claim's checkpoint record into entries: `driver`,
//! `pool`, `device`, `shareID` (a share of a consumable-shares device), and `data` with the UUID
//! containers see, the physical GPU's UUID and minor, the product, the MIG profile and the
//! sharing strategy ([`DeviceStatusData`], the format docs/operations.md documents). The driver
//! hands them to a [`ClaimStatusSink`] after prepare (and an empty list after unprepare); the
//! node plugin's sink writes them to the API server in the background.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::{Deserialize, Serialize};
use tessera_api::DRIVER_NAME;
use tessera_kubelet_grpc::{ClaimRef, ClaimUid};

use crate::checkpoint::{ClaimRecord, DeviceTarget};

/// What `status.devices[].data` holds for a Tessera device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatusData {
    /// The UUID containers see: `GPU-…` for a whole GPU, `MIG-…` for a MIG device (absent for a
    /// dynamic MIG device not created yet, which a prepared claim never has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The physical GPU's UUID (the same as `uuid` for a whole GPU).
    #[serde(rename = "gpuUUID")]
    pub gpu_uuid: String,
    /// The physical GPU's device minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// The product name NVML reports, when the node's inventory knows the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// The MIG profile (`1g.10gb`) of a MIG device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// `TimeSlicing` or `MPS` when the claim's config shares the device; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<String>,
}

/// The `status.devices` entries of a prepared claim. `product` names the product of a GPU by its
/// UUID (the node's inventory).
pub fn device_statuses(
    record: &ClaimRecord,
    product: impl Fn(&str) -> Option<String>,
) -> Vec<AllocatedDeviceStatus> {
    record
        .devices
        .iter()
        .map(|device| {
            let target = &device.target;
            let data = DeviceStatusData {
                uuid: target.visible_uuid().map(str::to_owned),
                gpu_uuid: target.gpu_uuid().to_owned(),
                minor: target.gpu_minor(),
                product: product(target.gpu_uuid()),
                mig_profile: match target {
                    DeviceTarget::Mig { profile, .. } => Some(profile.clone()),
                    DeviceTarget::Gpu { .. } => None,
                },
                sharing: device.sharing.as_ref().map(|s| s.strategy.to_string()),
            };
            AllocatedDeviceStatus {
                driver: DRIVER_NAME.to_owned(),
                pool: device.pool.clone(),
                device: device.device.clone(),
                share_id: device.share.as_ref().map(|s| s.share_id.clone()),
                data: Some(RawExtension(
                    serde_json::to_value(&data).unwrap_or(serde_json::Value::Null),
                )),
                ..AllocatedDeviceStatus::default()
            }
        })
        .collect()
}

/// Where the driver reports prepared and unprepared claims. Both calls return at once.
pub trait ClaimStatusSink: Send + Sync + 'static {
    /// `claim` is prepared with these devices.
    fn prepared(&self, claim: ClaimRef, devices: Vec<AllocatedDeviceStatus>);
    /// `claim` is unprepared: its entries go.
    fn unprepared(&self, claim: ClaimRef);
}

/// A sink that remembers what it was told (tests).
#[derive(Debug, Default)]
pub struct RecordedStatus {
    /// Each claim's latest reported devices (none after unprepare), by UID.
    pub claims: Mutex<BTreeMap<ClaimUid, Vec<AllocatedDeviceStatus>>>,
}

impl ClaimStatusSink for RecordedStatus {
    fn prepared(&self, claim: ClaimRef, devices: Vec<AllocatedDeviceStatus>) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.insert(claim.uid, devices);
    }

    fn unprepared(&self, claim: ClaimRef) {
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.insert(claim.uid, Vec::new());
    }
}
