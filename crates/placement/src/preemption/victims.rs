//! Who could be preempted: the running pods that hold topology-managed devices, in **units** that
//! are evicted whole (a pod alone, or every running pod of a gang), with the claims whose devices
//! eviction frees. A claim's devices are freed only when every consumer in its
//! `status.reservedFor` is evicted (the resourceclaim controller releases a claim once no
//! reserving pod is left), so a claim that a pod outside the victims also reserves is never
//! counted as freed. Built once from the cluster's objects; read by every preemption search.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::DeviceId;

use super::budgets::DisruptionBudgets;
use super::mark::PreemptedBy;
use super::priority::pod_priority;
use crate::claims::allocation;
use crate::group::{GroupKey, group_key};
use crate::pods::pod_usage_requests;
use crate::protocol::{is_bound, is_terminal, object_key};
use crate::resources::Requests;
use crate::view::ClusterSnapshot;

/// Grace period of a pod that does not set one (the API's default).
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// A running pod that holds managed devices (or belongs to a gang that does).
#[derive(Clone, Debug, PartialEq)]
pub struct VictimPod {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    pub priority: i32,
    /// The node it is bound to.
    pub node: String,
    /// What it requests of its node (freed with it).
    pub requests: Requests,
    /// Managed devices its claims hold times the seconds it has run: the work lost if evicted.
    pub gpu_seconds: u64,
    /// `spec.terminationGracePeriodSeconds` (30 when unset).
    pub grace_seconds: i64,
    /// The budgets covering it.
    pub budgets: Vec<usize>,
    /// Indices of the held claims it reserves.
    pub claims: Vec<usize>,
}

/// Pods evicted together: one pod, or the running pods of one gang.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// Indices into [`Victims::pods`], by key.
    pub pods: Vec<usize>,
    pub group: Option<GroupKey>,
    /// The highest priority of its pods: a unit is preempted only by a pod of higher priority
    /// than every pod in it, and each of its pods counts at this priority.
    pub priority: i32,
    pub gpu_seconds: u64,
    /// Held claims any of its pods reserves.
    pub claims: Vec<usize>,
    /// Pods per budget.
    pub budgets: BTreeMap<usize, u32>,
    /// Why it can never be evicted, whoever asks.
    pub blocked: Option<Blocked>,
}

impl Unit {
    /// A unit removed from a kept index ([`super::KeptVictims`]): no pods, nothing held; no
    /// preemptor sees it.
    pub fn is_gone(&self) -> bool {
        self.pods.is_empty()
    }

    pub(super) fn gone() -> Unit {
        Unit {
            pods: Vec::new(),
            group: None,
            priority: 0,
            gpu_seconds: 0,
            claims: Vec::new(),
            budgets: BTreeMap::new(),
            blocked: None,
        }
    }
}

/// Why a unit cannot be evicted by any preemptor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Blocked {
    /// A pod is covered by more than one budget: the Eviction API refuses such pods.
    MultipleBudgets { pod: String },
    /// The unit has more pods under this budget than it allows to be disrupted now.
    Budget { budget: String, allowed: u32 },
}

/// An allocated claim holding managed devices, reserved only by victim pods.
#[derive(Clone, Debug)]
pub struct HeldClaim {
    pub claim: Arc<ResourceClaim>,
    /// Its managed devices and their nodes (indices into [`ClusterSnapshot::nodes`]).
    pub devices: Vec<(DeviceId, usize)>,
    /// Every device of its allocation is allocated whole, none shared (no `shareID`) nor with
    /// admin access: freeing it is taking [`HeldClaim::devices`] out of what is in use.
    pub whole: bool,
    /// The units of its consumers (sorted): all of them must be evicted to free it.
    pub units: Vec<usize>,
}

/// The running pods that hold managed devices, in units, with their claims.
#[derive(Clone, Debug, Default)]
pub struct Victims {
    pub pods: Vec<VictimPod>,
    pub units: Vec<Unit>,
    pub claims: Vec<HeldClaim>,
    /// Per node (index into [`ClusterSnapshot::nodes`]): the units holding devices there, each
    /// with how many.
    pub by_node: HashMap<usize, Vec<(usize, usize)>>,
    pub budgets: DisruptionBudgets,
}

/// The managed devices of a [`ClusterSnapshot`] by pool and name, looked up without building an
/// id: built once per snapshot and kept by the caller ([`Victims::new`] reads it).
#[derive(Clone, Debug, Default)]
pub struct ManagedDevices {
    /// Pool name → its devices: name, id, node (index into [`ClusterSnapshot::nodes`]).
    by_pool: HashMap<String, Vec<(String, DeviceId, usize)>>,
}

impl ManagedDevices {
    /// Every managed device of `snapshot`, with its node.
    pub fn new(snapshot: &ClusterSnapshot) -> ManagedDevices {
        let mut by_pool: HashMap<String, Vec<(String, DeviceId, usize)>> = HashMap::new();
        for (index, node) in snapshot.nodes.iter().enumerate() {
            if !snapshot.managed_nodes.contains(&node.info.name) {
                continue;
            }
            for (id, _) in snapshot.managed.node_devices(&node.info.name) {
                by_pool.entry(id.pool().to_owned()).or_default().push((
                    id.device().to_owned(),
                    id.clone(),
                    index,
                ));
            }
        }
        ManagedDevices { by_pool }
    }

    /// The devices of one pool: a lookup per allocation, then a scan of the pool's few devices.
    fn pool(&self, pool: &str) -> &[(String, DeviceId, usize)] {
        self.by_pool.get(pool).map_or(&[], Vec::as_slice)
    }
}

/// Pods not considered as victims for one preemptor, by reason (for its message).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exclusions {
    /// Pods of a priority not lower than the preemptor's.
    pub not_lower: usize,
    /// Pods whose eviction was refused recently.
    pub refused: usize,
    /// Pods protected by a budget (its name) or covered by several.
    pub protected: BTreeMap<String, usize>,
}

impl Exclusions {
    /// `3 have a priority not below 1000, 2 are protected by PodDisruptionBudget ns/x`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if self.not_lower > 0 {
            parts.push(format!(
                "{} running pod(s) with devices have a priority not below the pod's",
                self.not_lower
            ));
        }
        for (budget, pods) in &self.protected {
            parts.push(format!("{pods} are protected by {budget}"));
        }
        if self.refused > 0 {
            parts.push(format!("{} had an eviction refused recently", self.refused));
        }
        parts.join(", ")
    }

    /// Lower-priority pods were set aside because a budget protects them or their eviction was
    /// refused: the pod waits on disruption budgets rather than on capacity alone.
    pub fn budgets_set_aside(&self) -> bool {
        !self.protected.is_empty() || self.refused > 0
    }
}

/// The seconds from `since` to `now`, 0 if unknown or in the future.
fn seconds_since(since: Option<Timestamp>, now: Timestamp) -> u64 {
    since
        .map(|s| now.duration_since(s).as_secs())
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0)
}

/// A pod that could be evicted: bound, running or about to, not being deleted.
pub(super) fn is_running(pod: &Pod) -> bool {
    is_bound(pod) && !is_terminal(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// Whether `pod` is the victim of a plan still being carried out: its UID is in `promised`, or
/// it is marked [`PreemptedBy`].
pub(super) fn is_promised(pod: &Pod, promised: &HashSet<String>) -> bool {
    promised.contains(pod.metadata.uid.as_deref().unwrap_or_default())
        || PreemptedBy::is_marked(pod)
}

/// `budgets` with one disruption charged per budget covering each of the `promised` pods.
pub(super) fn spent<'p>(
    mut budgets: DisruptionBudgets,
    promised: impl IntoIterator<Item = &'p Pod>,
) -> DisruptionBudgets {
    for pod in promised {
        for b in budgets.covering(pod) {
            budgets.spend(b, 1);
        }
    }
    budgets
}

pub(super) fn victim_pod(pod: &Pod, budgets: &DisruptionBudgets) -> VictimPod {
    let spec = pod.spec.as_ref();
    VictimPod {
        key: object_key(&pod.metadata),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        priority: pod_priority(pod),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        requests: pod_usage_requests(pod),
        gpu_seconds: 0,
        grace_seconds: spec
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(DEFAULT_GRACE_SECONDS),
        budgets: budgets.covering(pod),
        claims: Vec::new(),
    }
}

impl Victims {
    /// Indexes the running pods of `pods` that hold managed `devices` (of a snapshot) through
    /// `claims`, with the budgets covering them. Pods whose UID is in `promised` are victims of
    /// plans still being carried out ([`super::nomination::Nominations::promised`]), and so are
    /// pods marked [`super::nomination::PreemptedBy`]: they are nobody else's victims, and their
    /// evictions are charged to their budgets now.
    pub fn new<'p>(
        devices: &ManagedDevices,
        pods: impl IntoIterator<Item = &'p Pod>,
        claims: impl IntoIterator<Item = Arc<ResourceClaim>>,
        budgets: DisruptionBudgets,
        promised: &HashSet<String>,
        now: Timestamp,
    ) -> Victims {
        let pods: Vec<&Pod> = pods.into_iter().filter(|p| is_running(p)).collect();
        let is_promised = |pod: &Pod| is_promised(pod, promised);
        let budgets = spent(budgets, pods.iter().copied().filter(|p| is_promised(p)));
        let pods = pods.into_iter().filter(|p| !is_promised(p));
        Victims::assemble(devices, pods, claims, budgets, now)
    }

    /// The index of running, unpromised `pods` holding managed `devices` through `claims`, under
    /// `budgets` (the promised victims' evictions already charged).
    pub(super) fn assemble<'p>(
        devices: &ManagedDevices,
        pods: impl IntoIterator<Item = &'p Pod>,
        claims: impl IntoIterator<Item = Arc<ResourceClaim>>,
        budgets: DisruptionBudgets,
        now: Timestamp,
    ) -> Victims {
        let mut victims = Victims {
            budgets,
            ..Victims::default()
        };
        let mut by_uid: HashMap<String, usize> = HashMap::new();
        let mut groups: Vec<Option<GroupKey>> = Vec::new();
        let mut started: Vec<Option<Timestamp>> = Vec::new();
        for pod in pods {
            let victim = victim_pod(pod, &victims.budgets);
            by_uid.insert(victim.uid.clone(), victims.pods.len());
            groups.push(group_key(pod));
            started.push(
                pod.status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref())
                    .or(pod.metadata.creation_timestamp.as_ref())
                    .map(|t| t.0),
            );
            victims.pods.push(victim);
        }
        for claim in claims {
            victims.add_claim(claim, devices, &by_uid);
        }
        for (index, pod) in victims.pods.iter_mut().enumerate() {
            let devices: usize = pod
                .claims
                .iter()
                .map(|&c| victims.claims[c].devices.len())
                .sum();
            pod.gpu_seconds = seconds_since(started[index], now).saturating_mul(devices as u64);
        }
        victims.build_units(&groups);
        victims
    }

    /// Whether no unit is left to evict (a kept index may hold units removed since:
    /// [`Unit::is_gone`]).
    pub fn is_empty(&self) -> bool {
        self.units.iter().all(Unit::is_gone)
    }

    /// Records `claim` if it holds managed devices and only running pods reserve it.
    fn add_claim(
        &mut self,
        claim: Arc<ResourceClaim>,
        managed: &ManagedDevices,
        by_uid: &HashMap<String, usize>,
    ) {
        let Some(allocation) = allocation(&claim) else {
            return;
        };
        let mut devices: Vec<(DeviceId, usize)> = Vec::new();
        let mut pool: (&str, &[(String, DeviceId, usize)]) = ("", &[]);
        for r in allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .filter(|r| r.admin_access != Some(true))
        {
            if pool.0 != r.pool {
                pool = (&r.pool, managed.pool(&r.pool));
            }
            if let Some((_, id, node)) = pool
                .1
                .iter()
                .find(|(name, id, _)| *name == r.device && id.driver() == r.driver)
            {
                devices.push((id.clone(), *node));
            }
        }
        if devices.is_empty() {
            return;
        }
        let reserved = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_deref())
            .unwrap_or_default();
        let consumers: Option<Vec<usize>> = reserved
            .iter()
            .map(|r| (r.resource == "pods").then(|| by_uid.get(&r.uid).copied())?)
            .collect();
        // Unreserved (allocated for a pod not running yet) or reserved by something that is not
        // a running pod: eviction frees nothing.
        let Some(consumers) = consumers.filter(|c| !c.is_empty()) else {
            return;
        };
        let results = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten());
        let whole = results
            .clone()
            .all(|r| r.share_id.is_none() && r.admin_access != Some(true))
            && results.count() == devices.len();
        let index = self.claims.len();
        for &pod in &consumers {
            self.pods[pod].claims.push(index);
        }
        self.claims.push(HeldClaim {
            claim,
            devices,
            whole,
            units: Vec::new(),
        });
    }

    /// Gathers pods into units (a gang's running pods together) and indexes them by node.
    fn build_units(&mut self, groups: &[Option<GroupKey>]) {
        let holds = |p: &VictimPod| !p.claims.is_empty();
        let held_groups: HashSet<&GroupKey> = self
            .pods
            .iter()
            .zip(groups)
            .filter(|(p, _)| holds(p))
            .filter_map(|(_, g)| g.as_ref())
            .collect();
        let mut members: BTreeMap<(Option<GroupKey>, String), Vec<usize>> = BTreeMap::new();
        for (index, (pod, group)) in self.pods.iter().zip(groups).enumerate() {
            match group.as_ref().filter(|g| held_groups.contains(g)) {
                Some(g) => members.entry((Some(g.clone()), String::new())),
                None if holds(pod) => members.entry((None, pod.key.clone())),
                None => continue,
            }
            .or_default()
            .push(index);
        }
        let mut unit_of_pod: HashMap<usize, usize> = HashMap::new();
        for ((group, _), pods) in members {
            let index = self.units.len();
            for &p in &pods {
                unit_of_pod.insert(p, index);
            }
            let unit = self.unit(group, pods);
            self.units.push(unit);
        }
        for (p, pod) in self.pods.iter().enumerate() {
            if let Some(&unit) = unit_of_pod.get(&p) {
                for &c in &pod.claims {
                    self.claims[c].units.push(unit);
                }
            }
        }
        for claim in &mut self.claims {
            claim.units.sort_unstable();
            claim.units.dedup();
        }
        for (index, unit) in self.units.iter().enumerate() {
            let mut held: BTreeMap<usize, usize> = BTreeMap::new();
            for &c in &unit.claims {
                for (_, node) in &self.claims[c].devices {
                    *held.entry(*node).or_default() += 1;
                }
            }
            for (node, devices) in held {
                self.by_node.entry(node).or_default().push((index, devices));
            }
        }
    }

    fn unit(&self, group: Option<GroupKey>, pods: Vec<usize>) -> Unit {
        let mut claims: Vec<usize> = pods
            .iter()
            .flat_map(|&p| self.pods[p].claims.iter().copied())
            .collect();
        claims.sort_unstable();
        claims.dedup();
        let (budgets, blocked) = self.unit_budgets(&pods);
        Unit {
            priority: pods
                .iter()
                .map(|&p| self.pods[p].priority)
                .max()
                .unwrap_or(0),
            gpu_seconds: pods.iter().map(|&p| self.pods[p].gpu_seconds).sum(),
            pods,
            group,
            claims,
            budgets,
            blocked,
        }
    }

    /// The pods per budget of a unit of `pods`, and why the budgets block its eviction, if they
    /// do.
    pub(super) fn unit_budgets(&self, pods: &[usize]) -> (BTreeMap<usize, u32>, Option<Blocked>) {
        let mut budgets: BTreeMap<usize, u32> = BTreeMap::new();
        // The first such pod by name, whatever order the unit lists its pods in.
        let mut blocked = pods
            .iter()
            .map(|&p| &self.pods[p])
            .filter(|pod| pod.budgets.len() > 1)
            .map(|pod| &pod.key)
            .min()
            .map(|key| Blocked::MultipleBudgets { pod: key.clone() });
        for &p in pods {
            let pod = &self.pods[p];
            for &b in &pod.budgets {
                *budgets.entry(b).or_default() += 1;
            }
        }
        for (&b, &n) in &budgets {
            if n > self.budgets.allowed(b) {
                blocked.get_or_insert(Blocked::Budget {
                    budget: self.budgets.name(b).to_owned(),
                    allowed: self.budgets.allowed(b),
                });
            }
        }
        (budgets, blocked)
    }

    /// Which units a preemptor of `priority` may evict (indexed like [`Victims::units`]), and
    /// why the others are not: a priority not lower, a budget, a refused eviction (pod UIDs in
    /// `refused`), or the preemptor's own group.
    pub fn eligible(
        &self,
        priority: i32,
        refused: &HashSet<String>,
        own_group: Option<&GroupKey>,
    ) -> (Vec<bool>, Exclusions) {
        let mut exclusions = Exclusions::default();
        let eligible = self
            .units
            .iter()
            .map(|unit| {
                let pods = unit.pods.len();
                if unit.is_gone() {
                    return false;
                }
                if unit.priority >= priority
                    || (own_group.is_some() && unit.group.as_ref() == own_group)
                {
                    exclusions.not_lower += pods;
                    return false;
                }
                if let Some(blocked) = &unit.blocked {
                    let name = match blocked {
                        Blocked::MultipleBudgets { .. } => {
                            "more than one PodDisruptionBudget each".to_owned()
                        }
                        Blocked::Budget { budget, allowed } => format!(
                            "PodDisruptionBudget {budget} ({allowed} disruption(s) allowed)"
                        ),
                    };
                    *exclusions.protected.entry(name).or_default() += pods;
                    return false;
                }
                if unit
                    .pods
                    .iter()
                    .any(|&p| refused.contains(&self.pods[p].uid))
                {
                    exclusions.refused += pods;
                    return false;
                }
                true
            })
            .collect();
        (eligible, exclusions)
    }

    /// Whether a set of units stays within every budget.
    pub fn within_budgets(&self, units: impl IntoIterator<Item = usize>) -> bool {
        let mut spent: BTreeMap<usize, u32> = BTreeMap::new();
        for u in units {
            for (&b, &n) in &self.units[u].budgets {
                let total = spent.entry(b).or_default();
                *total += n;
                if *total > self.budgets.allowed(b) {
                    return false;
                }
            }
        }
        true
    }
}
