//! A cluster as API objects, changed the way the API server, the kubelet and the resourceclaim
//! controller change it: gated pods with one claim each are created, placed (claims allocated
//! and reserved, the pod bound and running), evicted (terminating, a budget permitting), finish
//! (the pod and its claim gone) or are deleted. It refuses to allocate a device some claim holds
//! already: that is the invariant everything else is checked against.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSchedulingGate, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::{AllocatedState, DeviceId, NODE_NAME_FIELD};
use tessera_api::names::{
    DRIVER_NAME, GPU_DEVICE_CLASS, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, NOMINATION_ANNOTATION,
};

use crate::claims::allocation;
use crate::pods::{devices_in_use, node_usage};
use crate::preemption::covers;
use crate::preemption::nomination::Nomination;
use crate::protocol::{is_gated, object_key};
use crate::resolve::PodClaim;
use crate::resources::NodeUsage;
use crate::synthetic;
use crate::view::ClusterSnapshot;

/// The namespace of every simulated object.
pub const NAMESPACE: &str = "sim";

/// A pod to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTemplate {
    pub name: String,
    pub priority: i32,
    /// GPUs its one claim asks for.
    pub gpus: u32,
    /// Its gang and the gang's minCount.
    pub group: Option<(String, u32)>,
    /// `preemptionPolicy: Never`.
    pub never_preempts: bool,
    /// Labels (budgets select by them).
    pub labels: BTreeMap<String, String>,
    pub grace_seconds: i64,
}

impl PodTemplate {
    /// A pod of `gpus` GPUs at `priority`, alone, preempting, no labels, 30 s grace.
    pub fn new(name: &str, priority: i32, gpus: u32) -> PodTemplate {
        PodTemplate {
            name: name.to_owned(),
            priority,
            gpus,
            group: None,
            never_preempts: false,
            labels: BTreeMap::new(),
            grace_seconds: 30,
        }
    }
}

/// Why the model refused a change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("device {device} allocated to claim {claim} is already held by claim {holder}")]
    DoubleAllocation {
        device: String,
        claim: String,
        holder: String,
    },
    #[error("no pod with UID {0}")]
    NoPod(String),
    #[error("claim {0} does not exist")]
    NoClaim(String),
}

/// Why an eviction was refused (what the Eviction API answers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 429: a budget allows no more disruptions.
    Budget(String),
    /// The pod is covered by more than one budget.
    MultipleBudgets,
    /// 404 or a UID precondition that failed: not that pod any more.
    Gone,
}

/// A budget: the pods `labels` select must keep `min_available` running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetTemplate {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub min_available: u32,
}

/// The cluster's objects.
pub struct ClusterModel {
    pub snapshot: ClusterSnapshot,
    /// By UID.
    pods: BTreeMap<String, Pod>,
    /// By name (all in [`NAMESPACE`]).
    claims: BTreeMap<String, Arc<ResourceClaim>>,
    budgets: Vec<(BudgetTemplate, PodDisruptionBudget)>,
    /// Which claim holds each allocated device.
    held: HashMap<DeviceId, String>,
    pub now: Timestamp,
    pub gate: String,
    created: u64,
}

fn meta(name: &str, uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        uid: Some(uid.to_owned()),
        ..Default::default()
    }
}

impl ClusterModel {
    pub fn new(snapshot: ClusterSnapshot, gate: &str, now: Timestamp) -> ClusterModel {
        ClusterModel {
            snapshot,
            pods: BTreeMap::new(),
            claims: BTreeMap::new(),
            budgets: Vec::new(),
            held: HashMap::new(),
            now,
            gate: gate.to_owned(),
            created: 0,
        }
    }

    /// Creates a gated pod and its claim; returns the pod's UID. UIDs sort in creation order.
    pub fn create(&mut self, template: &PodTemplate) -> String {
        self.created += 1;
        let uid = format!("{:08}-{}", self.created, template.name);
        let claim_name = format!("{}-gpus", template.name);
        let claim = synthetic::device_claim(
            NAMESPACE,
            &claim_name,
            &format!("{uid}-claim"),
            GPU_DEVICE_CLASS,
            i64::from(template.gpus),
        );
        self.claims.insert(claim_name.clone(), Arc::new(claim));
        let mut metadata = meta(&template.name, &uid);
        metadata.creation_timestamp = Some(Time(self.now));
        let mut labels = template.labels.clone();
        if let Some((group, min)) = &template.group {
            labels.insert(GROUP_LABEL.to_owned(), group.clone());
            metadata.annotations = Some(BTreeMap::from([(
                GROUP_MIN_COUNT_ANNOTATION.to_owned(),
                min.to_string(),
            )]));
        }
        metadata.labels = Some(labels);
        let pod = Pod {
            metadata,
            spec: Some(PodSpec {
                priority: Some(template.priority),
                preemption_policy: template.never_preempts.then(|| "Never".to_owned()),
                termination_grace_period_seconds: Some(template.grace_seconds),
                scheduling_gates: Some(vec![PodSchedulingGate {
                    name: self.gate.clone(),
                }]),
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpus".into(),
                    resource_claim_name: Some(claim_name),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        };
        self.pods.insert(uid.clone(), pod);
        uid
    }

    /// Creates a pod that runs already on `node`, its claim holding `devices` there (device
    /// names), as if placed earlier: for benchmarks that start from a full cluster. Refuses a
    /// device held already.
    pub fn run_placed(
        &mut self,
        template: &PodTemplate,
        node: &str,
        devices: &[String],
    ) -> Result<String, ModelError> {
        let uid = self.create(template);
        let claim = format!("{}-gpus", template.name);
        self.allocate(&claim, device_allocation(node, devices))?;
        self.run_on(&uid, node)?;
        Ok(uid)
    }

    /// Adds a budget.
    pub fn add_budget(&mut self, template: BudgetTemplate) {
        let pdb = PodDisruptionBudget {
            metadata: meta(&template.name, &format!("pdb-{}", template.name)),
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(template.labels.clone()),
                    match_expressions: None,
                }),
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus::default()),
        };
        self.budgets.push((template, pdb));
        self.refresh_budgets();
    }

    /// Recounts every budget's `disruptionsAllowed`, as the disruption controller does: running
    /// pods it selects, not terminating, less `minAvailable`.
    pub fn refresh_budgets(&mut self) {
        for (template, pdb) in &mut self.budgets {
            let healthy = self
                .pods
                .values()
                .filter(|p| is_running(p) && p.metadata.deletion_timestamp.is_none())
                .filter(|p| covers(pdb, p))
                .count();
            let allowed = healthy.saturating_sub(template.min_available as usize);
            if let Some(status) = pdb.status.as_mut() {
                status.disruptions_allowed = Some(i32::try_from(allowed).unwrap_or(i32::MAX));
            }
        }
    }

    pub fn budgets(&self) -> impl Iterator<Item = &PodDisruptionBudget> {
        self.budgets.iter().map(|(_, pdb)| pdb)
    }

    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.pods.get(uid)
    }

    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values()
    }

    pub fn claims(&self) -> impl Iterator<Item = &Arc<ResourceClaim>> {
        self.claims.values()
    }

    /// The claims of a pod, resolved.
    pub fn claims_of(&self, pod: &Pod) -> Vec<PodClaim> {
        pod.spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .filter_map(|c| {
                let name = c.resource_claim_name.as_ref()?;
                Some(PodClaim {
                    pod_claim: c.name.clone(),
                    claim: self.claims.get(name)?.clone(),
                })
            })
            .collect()
    }

    /// Every allocated claim's devices.
    pub fn in_use(&self) -> AllocatedState {
        devices_in_use(self.claims.values().map(|c| &**c)).0
    }

    /// What the pods on each node request.
    pub fn usage(&self) -> HashMap<String, NodeUsage> {
        node_usage(self.pods.values(), "")
    }

    /// Allocates `allocation` to claim `name`, refusing any device another claim holds.
    pub fn allocate(&mut self, name: &str, allocation: AllocationResult) -> Result<(), ModelError> {
        let ids = allocated_devices(&allocation);
        for id in &ids {
            if let Some(holder) = self.held.get(id).filter(|h| *h != name) {
                return Err(ModelError::DoubleAllocation {
                    device: id.to_string(),
                    claim: name.to_owned(),
                    holder: holder.clone(),
                });
            }
        }
        let claim = self
            .claims
            .get_mut(name)
            .ok_or_else(|| ModelError::NoClaim(name.to_owned()))?;
        let claim = Arc::make_mut(claim);
        claim.status.get_or_insert_with(Default::default).allocation = Some(allocation);
        for id in ids {
            self.held.insert(id, name.to_owned());
        }
        Ok(())
    }

    /// Releases the pod to `node` and runs it there at once (gate removed, bound, running, its
    /// claims reserved for it). Its nomination, if any, goes with the gate.
    pub fn run_on(&mut self, uid: &str, node: &str) -> Result<(), ModelError> {
        let now = self.now;
        let pod = self
            .pods
            .get_mut(uid)
            .ok_or_else(|| ModelError::NoPod(uid.to_owned()))?;
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.scheduling_gates = None;
        spec.node_name = Some(node.to_owned());
        let status = pod.status.get_or_insert_with(Default::default);
        status.phase = Some("Running".into());
        status.start_time = Some(Time(now));
        if let Some(a) = pod.metadata.annotations.as_mut() {
            a.remove(NOMINATION_ANNOTATION);
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let names: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
            .filter_map(|c| c.resource_claim_name.clone())
            .collect();
        for name in names {
            let claim = self
                .claims
                .get_mut(&name)
                .ok_or_else(|| ModelError::NoClaim(name.clone()))?;
            let status = Arc::make_mut(claim)
                .status
                .get_or_insert_with(ResourceClaimStatus::default);
            status.reserved_for = Some(vec![ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: pod_name.clone(),
                uid: uid.to_owned(),
            }]);
        }
        Ok(())
    }

    /// Writes (or with `None` removes) a pod's nomination.
    pub fn set_nomination(&mut self, uid: &str, nomination: Option<&Nomination>) {
        self.annotate(
            uid,
            NOMINATION_ANNOTATION,
            nomination.map(Nomination::to_annotation),
        );
    }

    /// Sets (or with `None` removes) annotation `key` of pod `uid`.
    pub fn annotate(&mut self, uid: &str, key: &str, value: Option<String>) {
        let Some(pod) = self.pods.get_mut(uid) else {
            return;
        };
        let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        match value {
            Some(v) => annotations.insert(key.to_owned(), v),
            None => annotations.remove(key),
        };
    }

    /// The Eviction API for pod `uid`: refused when the pod is gone, when more than one budget
    /// covers it, or when a covering budget allows no disruption; otherwise the pod starts
    /// terminating and the budget is charged.
    pub fn evict(&mut self, uid: &str) -> Result<(), Refusal> {
        let Some(pod) = self.pods.get(uid) else {
            return Err(Refusal::Gone);
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let covering: Vec<usize> = (0..self.budgets.len())
            .filter(|&i| covers(&self.budgets[i].1, pod))
            .collect();
        if covering.len() > 1 {
            return Err(Refusal::MultipleBudgets);
        }
        if let Some(&i) = covering.first() {
            let pdb = &mut self.budgets[i].1;
            let status = pdb.status.get_or_insert_with(Default::default);
            let allowed = status.disruptions_allowed.unwrap_or(0);
            if allowed <= 0 {
                return Err(Refusal::Budget(object_key(&pdb.metadata)));
            }
            status.disruptions_allowed = Some(allowed - 1);
        }
        if let Some(pod) = self.pods.get_mut(uid) {
            pod.metadata.deletion_timestamp = Some(Time(self.now));
        }
        Ok(())
    }

    /// The pod is gone (finished, or its eviction completed, or deleted): its claims go with it
    /// (one claim per pod, like claims generated from a template).
    pub fn remove(&mut self, uid: &str) {
        let Some(pod) = self.pods.remove(uid) else {
            return;
        };
        for c in pod
            .spec
            .iter()
            .flat_map(|s| s.resource_claims.iter().flatten())
        {
            if let Some(claim) = c
                .resource_claim_name
                .as_ref()
                .and_then(|name| self.claims.remove(name))
                && let Some(a) = allocation(&claim)
            {
                for id in allocated_devices(a) {
                    self.held.remove(&id);
                }
            }
        }
    }

    /// UIDs of the gated pods, not being deleted.
    pub fn gated(&self) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, p)| is_gated(p, &self.gate) && p.metadata.deletion_timestamp.is_none())
            .map(|(uid, _)| uid.clone())
            .collect()
    }
}

/// Whether a pod runs (bound and in phase Running).
pub fn is_running(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// An allocation of `devices` (names) of Tessera's driver on `node`, for request
/// [`synthetic::REQUEST`], restricted to the node as the allocator restricts it.
pub fn device_allocation(node: &str, devices: &[String]) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(
                devices
                    .iter()
                    .map(|d| DeviceRequestAllocationResult {
                        request: synthetic::REQUEST.to_owned(),
                        driver: DRIVER_NAME.to_owned(),
                        pool: node.to_owned(),
                        device: d.clone(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            config: None,
        }),
        node_selector: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: NODE_NAME_FIELD.to_owned(),
                    operator: "In".to_owned(),
                    values: Some(vec![node.to_owned()]),
                }]),
                match_expressions: None,
            }],
        }),
        allocation_timestamp: None,
    }
}

fn allocated_devices(allocation: &AllocationResult) -> Vec<DeviceId> {
    allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| DeviceId::new(&r.driver, &r.pool, &r.device))
        .collect()
}
