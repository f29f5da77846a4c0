//! The objects of one allocation problem and the verdict on it, in the JSON form both sides
//! read and write (tests/parity/internal/oracle has the Go twin of these types).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

/// A device by driver, pool and name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRef {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// One shared allocation of a device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedRef {
    #[serde(flatten)]
    pub device: DeviceRef,
    #[serde(rename = "shareID")]
    pub share_id: String,
}

/// Capacity consumed on a device by shared allocations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConsumedRef {
    #[serde(flatten)]
    pub device: DeviceRef,
    pub capacity: BTreeMap<String, Quantity>,
}

/// Allocated state given directly (upstream's unit test cases do that).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExplicitState {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<SharedRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumed: Vec<ConsumedRef>,
}

/// One allocation problem: the cluster's objects and the claims of one pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<Node>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<ResourceSlice>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<DeviceClass>,
    #[serde(default)]
    pub claims: Vec<ResourceClaim>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated_claims: Vec<ResourceClaim>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ExplicitState>,
    /// Only this node (replays of upstream's unit test cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Generated as adversarial: built so that upstream's search runs past its Filter timeout.
    /// Only such an instance may time out upstream; the reference decides it instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adversarial: bool,
    /// Stops upstream's Filter sooner than its 10 s (adversarial instances only, whose shape
    /// needs far longer: the verdict is the same timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_timeout_millis: Option<u64>,
}

/// The kind of a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    Allocated,
    Unsatisfiable,
    Error,
}

impl std::fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerdictKind::Allocated => "allocated",
            VerdictKind::Unsatisfiable => "unsatisfiable",
            VerdictKind::Error => "error",
        })
    }
}

/// What one side decided for one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    pub node: String,
    pub outcome: VerdictKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<AllocationResult>,
    #[serde(default)]
    pub micros: i64,
}

/// What one side decided for the pod: the outcome, the node and allocations, or the error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    #[serde(default)]
    pub name: String,
    pub outcome: VerdictKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<AllocationResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeVerdict>,
}

/// The API server's defaults for the fields the allocator reads (`allocationMode: ExactCount`,
/// `count: 1`, toleration `operator: Equal`), applied in place so that both sides see objects as
/// they are stored.
pub fn apply_defaults(instance: &mut Instance) {
    for claim in instance
        .claims
        .iter_mut()
        .chain(instance.allocated_claims.iter_mut())
    {
        let Some(devices) = claim.spec.as_mut().and_then(|s| s.devices.as_mut()) else {
            continue;
        };
        for request in devices.requests.iter_mut().flatten() {
            if let Some(e) = request.exactly.as_mut() {
                default_mode(&mut e.allocation_mode, &mut e.count);
                default_tolerations(e.tolerations.as_mut());
            }
            for sub in request.first_available.iter_mut().flatten() {
                default_mode(&mut sub.allocation_mode, &mut sub.count);
                default_tolerations(sub.tolerations.as_mut());
            }
        }
    }
}

fn default_mode(mode: &mut Option<String>, count: &mut Option<i64>) {
    if mode.as_deref().unwrap_or_default().is_empty() {
        *mode = Some("ExactCount".into());
    }
    if mode.as_deref() == Some("ExactCount") && count.unwrap_or(0) == 0 {
        *count = Some(1);
    }
}

fn default_tolerations(
    tolerations: Option<&mut Vec<k8s_openapi::api::resource::v1::DeviceToleration>>,
) {
    for t in tolerations.into_iter().flatten() {
        if t.operator.as_deref().unwrap_or_default().is_empty() {
            t.operator = Some("Equal".into());
        }
    }
}
