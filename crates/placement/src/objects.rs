//! The decision for a pod among a plain set of API objects: what `tessera explain --pod` reads from
//! files (and what a live explain lists from the API server). The controller's own entry point,
//! [`crate::decide::decide`], over objects instead of watch caches.

use std::cell::OnceCell;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::DeviceIndex;

use crate::decide::decide;
use crate::decision::{ClusterSource, PreemptionObjects, Ruling};
use crate::group::membership::{GroupKey, group_key, member_arrival};
use crate::nodes::NodeFacts;
use crate::pods::is_candidate;
use crate::pods::{devices_in_use, node_usage};
use crate::preemption::pod_priority;
use crate::protocol::{is_gated, is_terminal, object_key};
use crate::view::{ClusterSnapshot, PodContext, Settings};

/// A set of API objects.
#[derive(Clone, Debug, Default)]
pub struct ClusterObjects {
    pub pods: Vec<Pod>,
    pub claims: Vec<ResourceClaim>,
    pub templates: Vec<ResourceClaimTemplate>,
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    pub nodes: Vec<Node>,
    /// PodDisruptionBudgets, which preemption honours.
    pub budgets: Vec<PodDisruptionBudget>,
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

    /// The gated pods the controller decides before `pod` (gated by `gate`), first in line
    /// first: those of higher priority, and those of the same priority created earlier (the
    /// controller's queue order). A group's members are counted each.
    pub fn ahead_of(&self, pod: &Pod, gate: &str) -> Vec<&Pod> {
        let rank = |p: &Pod| {
            (
                std::cmp::Reverse(pod_priority(p)),
                member_arrival(p),
                object_key(&p.metadata),
            )
        };
        let own = rank(pod);
        let mut ahead: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|p| is_candidate(p, gate) && is_gated(p, gate))
            .filter(|p| rank(p) < own)
            .collect();
        ahead.sort_by_cached_key(|p| rank(p));
        ahead
    }

    /// What the controller configured with `settings` does with `pod` at `now`: alone, or with
    /// its group (the waiting pods' accounts included). `pod_groups` are the upstream PodGroups
    /// among the objects. No group is known to be waiting for capacity.
    pub fn decide(
        &self,
        pod: &Pod,
        pod_groups: &[PodGroup],
        settings: &Settings,
        now: Timestamp,
    ) -> Ruling {
        let mut settings = settings.clone();
        settings.group.accounts = true;
        let source = self.source(pod_groups);
        decide(&Arc::new(pod.clone()), &source, &[], &settings, now).ruling
    }

    /// The objects with the PodGroups `pod_groups`, as a decision reads them.
    pub fn source<'a>(&'a self, pod_groups: &'a [PodGroup]) -> ObjectSource<'a> {
        ObjectSource {
            objects: self,
            pod_groups,
        }
    }
}

/// A set of objects with their PodGroups, as a decision reads them ([`ClusterSource`]).
pub struct ObjectSource<'a> {
    objects: &'a ClusterObjects,
    pod_groups: &'a [PodGroup],
}

/// A pod without a namespace is in `default`.
fn namespace_or_default(namespace: &str) -> &str {
    if namespace.is_empty() {
        "default"
    } else {
        namespace
    }
}

impl ClusterSource for ObjectSource<'_> {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        let namespace = namespace_or_default(namespace);
        self.objects
            .claims
            .iter()
            .find(|c| in_namespace(&c.metadata, namespace, name))
            .map(|c| Arc::new(c.clone()))
    }

    fn template_exists(&self, namespace: &str, name: &str) -> bool {
        let namespace = namespace_or_default(namespace);
        self.objects
            .templates
            .iter()
            .any(|t| in_namespace(&t.metadata, namespace, name))
    }

    fn group_pods(&self, key: &GroupKey) -> Vec<Arc<Pod>> {
        self.objects
            .pods
            .iter()
            .filter(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == key.namespace
                    && p.metadata.deletion_timestamp.is_none()
                    && !is_terminal(p)
                    && group_key(p).as_ref() == Some(key)
            })
            .map(|p| Arc::new(p.clone()))
            .collect()
    }

    fn pod_group(&self, key: &GroupKey) -> Option<&PodGroup> {
        self.pod_groups
            .iter()
            .find(|g| in_namespace(&g.metadata, &key.namespace, &key.name))
    }

    fn with_context(&self, except: &str, decide: &mut dyn FnMut(&PodContext<'_>)) {
        let objects = self.objects;
        let devices = ClusterSnapshot::new(
            objects.slices.clone(),
            objects.classes.clone(),
            objects.nodes.iter().map(NodeFacts::from).collect(),
        );
        let unmanaged_cell: OnceCell<Arc<DeviceIndex>> = OnceCell::new();
        let unmanaged = || {
            unmanaged_cell
                .get_or_init(|| {
                    Arc::new(devices.unmanaged(objects.slices.clone(), objects.classes.clone()))
                })
                .clone()
        };
        let (in_use, _) = devices_in_use(&objects.claims);
        let usage = node_usage(&objects.pods, except);
        decide(&PodContext {
            devices: &devices,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage: &usage,
        });
    }

    fn channel_holders(&self, clique: &str) -> Vec<String> {
        crate::imex::holders(&self.objects.claims, clique)
    }

    fn domain_nodes(&self) -> crate::imex::DomainNodes {
        crate::imex::DomainNodes::of(&self.objects.pods, |namespace, name| {
            self.claim(namespace, name)
        })
    }

    fn preemption(&self) -> Option<PreemptionObjects> {
        let objects = self.objects;
        Some(PreemptionObjects {
            pods: objects.pods.iter().cloned().map(Arc::new).collect(),
            claims: objects.claims.iter().cloned().map(Arc::new).collect(),
            budgets: objects.budgets.iter().cloned().map(Arc::new).collect(),
            ..PreemptionObjects::default()
        })
    }
}
