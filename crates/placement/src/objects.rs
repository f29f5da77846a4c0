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
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::DeviceIndex;

use crate::group::membership::{
    GroupKey, GroupSource, group_key, label_min_count, member_arrival, pod_group_min_count,
};
use crate::group::search::{GroupInput, GroupPlan, Member, decide_group};
use crate::nodes::NodeFacts;
use crate::planner::PodPlan;
use crate::pods::{devices_in_use, is_candidate, node_usage};
use crate::protocol::{is_bound, is_gated, is_terminal, object_key};
use crate::resolve::{Resolution, resolve_claims};
use crate::view::{ClusterSnapshot, PodContext, Settings, decide_pod};

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
    Decided(PodPlan),
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
        let claims = match self.resolve(pod) {
            Resolution::Resolved(claims) => claims,
            Resolution::Waiting(why) => return PodVerdict::WaitingForClaims(why),
            Resolution::Invalid(why) => return PodVerdict::InvalidClaims(why),
        };
        let usage = node_usage(&self.pods, pod.metadata.uid.as_deref().unwrap_or_default());
        self.with_context(&usage, |context| {
            PodVerdict::Decided(decide_pod(pod, &claims, context, settings, now))
        })
    }

    fn resolve(&self, pod: &Pod) -> Resolution {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        resolve_claims(
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
        )
    }

    fn with_context<T>(
        &self,
        usage: &std::collections::HashMap<String, crate::resources::NodeUsage>,
        decide: impl FnOnce(&PodContext<'_>) -> T,
    ) -> T {
        let devices = ClusterSnapshot::new(
            self.slices.clone(),
            self.classes.clone(),
            self.nodes.iter().map(NodeFacts::from).collect(),
        );
        let unmanaged_cell: OnceCell<Arc<DeviceIndex>> = OnceCell::new();
        let unmanaged = || {
            unmanaged_cell
                .get_or_init(|| {
                    Arc::new(devices.unmanaged(self.slices.clone(), self.classes.clone()))
                })
                .clone()
        };
        let (in_use, _) = devices_in_use(&self.claims);
        let context = PodContext {
            devices: &devices,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage,
        };
        decide(&context)
    }

    /// What the controller does with the group of `pod` (gated, naming a group): the group's
    /// decision with each waiting pod's account, as the controller's worker gathers it.
    /// `pod_groups` are the upstream PodGroups among the objects. `None`: the pod is not placed as
    /// part of a group (no group, not gated, or a PodGroup with the basic policy).
    pub fn decide_group_of(
        &self,
        pod: &Pod,
        pod_groups: &[PodGroup],
        settings: &Settings,
        now: Timestamp,
    ) -> Option<GroupVerdict> {
        if !is_gated(pod, &settings.gate) {
            return None;
        }
        let key = group_key(pod)?;
        let pods: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == key.namespace
                    && p.metadata.deletion_timestamp.is_none()
                    && !is_terminal(p)
                    && group_key(p).as_ref() == Some(&key)
            })
            .collect();
        let min_count = match group_min_count(&key, &pods, pod_groups) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(why) => return Some(GroupVerdict::Invalid(why)),
        };
        let gated: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| is_gated(p, &settings.gate))
            .collect();
        let placed = u32::try_from(pods.len() - gated.len()).unwrap_or(u32::MAX);
        let mut resolved: Vec<(&Pod, Vec<crate::resolve::PodClaim>)> = Vec::new();
        let mut unresolved = 0;
        for member in &gated {
            match self.resolve(member) {
                Resolution::Resolved(claims) => resolved.push((member, claims)),
                Resolution::Waiting(_) => unresolved += 1,
                Resolution::Invalid(why) => {
                    return Some(GroupVerdict::Invalid(format!(
                        "{key}: pod {}: {why}",
                        object_key(&member.metadata)
                    )));
                }
            }
        }
        resolved.sort_by_key(|(p, _)| (member_arrival(p), object_key(&p.metadata)));
        let input = GroupInput {
            key: &key,
            min_count,
            placed,
            members: resolved
                .iter()
                .map(|(pod, claims)| Member { pod, claims })
                .collect(),
            unresolved,
        };
        let mut group = settings.group.clone();
        group.accounts = true;
        let usage = node_usage(&self.pods, "");
        let decision = self.with_context(&usage, |context| {
            decide_group(&input, context, settings, &group, now)
        });
        let members = input
            .members
            .iter()
            .map(|m| object_key(&m.pod.metadata))
            .collect();
        Some(GroupVerdict::Decided {
            key: key.clone(),
            min_count,
            placed,
            members,
            decision,
        })
    }
}

/// A group's `minCount`: from the pods' annotation, or from its PodGroup among `pod_groups`
/// (`None`: the basic policy, the pods are placed one by one).
fn group_min_count(
    key: &GroupKey,
    pods: &[&Pod],
    pod_groups: &[PodGroup],
) -> Result<Option<u32>, String> {
    match key.source {
        GroupSource::Label => label_min_count(key, pods.iter().copied())
            .map(Some)
            .map_err(|e| e.to_string()),
        GroupSource::PodGroup => {
            let group = pod_groups
                .iter()
                .find(|g| in_namespace(&g.metadata, &key.namespace, &key.name))
                .ok_or_else(|| {
                    format!("{key} is not among the objects; without it the group waits (WaitingForGroup)")
                })?;
            pod_group_min_count(group).map_err(|e| e.to_string())
        }
    }
}

/// What the controller does with a group.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupVerdict {
    /// The group's definition is wrong or missing (why).
    Invalid(String),
    /// The group's decision; `members` are the gated pods with their claims, in the order tried.
    Decided {
        key: GroupKey,
        min_count: u32,
        placed: u32,
        members: Vec<String>,
        decision: GroupPlan,
    },
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
