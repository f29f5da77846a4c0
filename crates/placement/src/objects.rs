//! The decision for a pod among a plain set of API objects: what `tessera explain --pod` reads from
//! files (and what a live explain would list from the API server). The same steps as the
//! controller's worker — candidate check, claim resolution, devices in use, node usage, then
//! [`crate::view::decide_pod`] — over objects instead of watch caches.

use std::cell::OnceCell;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::Inventory;

use crate::nodes::NodeFacts;
use crate::planner::Decision;
use crate::pods::{devices_in_use, is_candidate, node_usage};
use crate::protocol::{is_bound, is_terminal, object_key};
use crate::resolve::{Resolution, resolve_claims};
use crate::view::{DeviceView, PodContext, Settings, decide_pod};

/// A set of API objects.
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub pods: Vec<Pod>,
    pub claims: Vec<ResourceClaim>,
    pub templates: Vec<ResourceClaimTemplate>,
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    pub nodes: Vec<Node>,
}

/// What the controller does with a pod.
#[derive(Clone, Debug, PartialEq)]
pub enum PodVerdict {
    /// The controller leaves the pod alone (why).
    NotCandidate(String),
    /// A claim of the pod does not exist yet or is being replaced (why).
    WaitingForClaims(String),
    /// The pod's claims cannot be resolved as written (why).
    InvalidClaims(String),
    /// The planner's decision.
    Decided(Decision),
}

fn in_namespace(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ns: &str,
    name: &str,
) -> bool {
    meta.namespace.as_deref().unwrap_or("default") == ns && meta.name.as_deref() == Some(name)
}

impl ClusterObjects {
    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods
            .iter()
            .find(|p| in_namespace(&p.metadata, namespace, name))
    }

    /// What the controller configured with `settings` does with `pod` at `now`.
    pub fn decide(&self, pod: &Pod, settings: &Settings, now: Timestamp) -> PodVerdict {
        if !is_candidate(pod, &settings.gate) {
            return PodVerdict::NotCandidate(not_candidate_reason(pod, &settings.gate));
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let resolution = resolve_claims(
            pod,
            |name| {
                self.claims
                    .iter()
                    .find(|c| in_namespace(&c.metadata, namespace, name))
                    .map(|c| Arc::new(c.clone()))
            },
            |name| {
                self.templates
                    .iter()
                    .any(|t| in_namespace(&t.metadata, namespace, name))
            },
        );
        let claims = match resolution {
            Resolution::Resolved(claims) => claims,
            Resolution::Waiting(why) => return PodVerdict::WaitingForClaims(why),
            Resolution::Invalid(why) => return PodVerdict::InvalidClaims(why),
        };
        let devices = DeviceView::new(
            self.slices.clone(),
            self.classes.clone(),
            self.nodes.iter().map(NodeFacts::from).collect(),
        );
        let unmanaged_cell: OnceCell<Arc<Inventory>> = OnceCell::new();
        let unmanaged = || {
            unmanaged_cell
                .get_or_init(|| {
                    Arc::new(devices.unmanaged(self.slices.clone(), self.classes.clone()))
                })
                .clone()
        };
        let (in_use, _) = devices_in_use(&self.claims);
        let usage = node_usage(&self.pods, pod.metadata.uid.as_deref().unwrap_or_default());
        let context = PodContext {
            devices: &devices,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage: &usage,
        };
        PodVerdict::Decided(decide_pod(pod, &claims, &context, settings, now))
    }
}

fn not_candidate_reason(pod: &Pod, gate: &str) -> String {
    let key = object_key(&pod.metadata);
    if pod.metadata.deletion_timestamp.is_some() {
        format!("pod {key} is being deleted")
    } else if is_terminal(pod) {
        format!("pod {key} has finished")
    } else if is_bound(pod) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        format!("pod {key} is bound to node {node} already")
    } else {
        format!(
            "pod {key} does not carry the scheduling gate {gate} and was not placed by the controller; \
             kube-scheduler places it"
        )
    }
}
