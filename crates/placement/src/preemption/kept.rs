//! The victim index kept current change by change ([`KeptVictims`]): a caller that sees every
//! change of a running pod, a claim, a nomination or the budgets applies it here instead of
//! building the index again from every pod and claim ([`Victims::new`]). A change touches the
//! units of the pods it names and of the pods tied to them (a gang's members, the consumers of a
//! claim they share): those units are removed and built again from the objects kept here, the rest
//! of the index stays as it was. Removed units stay in [`Victims::units`] as gone units
//! ([`super::Unit::is_gone`], seen by no preemptor) whose places new units reuse; a full build
//! compacts them. The index equals a fresh [`Victims::new`] of the same objects at the same time,
//! units and claims in another order (a workspace test checks it on random change sequences).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;

use super::budgets::DisruptionBudgets;
use super::mark::PreemptedBy;
use super::nomination::{Nomination, Nominations};
use super::victims::{
    HeldClaim, ManagedDevices, Unit, VictimPod, Victims, is_promised, is_running, spent,
};
use crate::claims::allocation;
use crate::group::{GroupKey, group_key};
use crate::protocol::object_key;
use crate::resources::Requests;

/// What keeping the index has cost so far, counted (not timed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptWork {
    /// Changes applied (pods, claims, budget lists).
    pub changes: u64,
    /// Pods whose units were built again by those changes, in all.
    pub pods_rebuilt: u64,
}

/// The victim index of a set of pods, claims and budgets, kept current as they change.
#[derive(Clone, Debug)]
pub struct KeptVictims {
    gate: String,
    /// Running pods by UID.
    running: HashMap<String, Arc<Pod>>,
    /// The UID of each pod kept (running or nominated), by `namespace/name`.
    uid_of: HashMap<String, String>,
    /// Pods that carry a nomination, by `namespace/name`.
    nominated: HashMap<String, Arc<Pod>>,
    /// Running pods (UIDs) per group.
    members: HashMap<GroupKey, BTreeSet<String>>,
    /// Allocated claims reserved by some pod, by `namespace/name`.
    claims: HashMap<String, Arc<ResourceClaim>>,
    /// Per pod UID: the claims whose `status.reservedFor` names it.
    reserving: HashMap<String, BTreeSet<String>>,
    /// The budgets as their status says, before the promised victims are charged.
    budgets: DisruptionBudgets,
    /// Victims (UIDs) of the nominations that stand.
    promised: HashSet<String>,
    /// Running pods (UIDs) marked as victims ([`PreemptedBy`]).
    marked: HashSet<String>,
    victims: Arc<Victims>,
    /// Where each pod with a unit is: its unit.
    unit_of_pod: HashMap<String, usize>,
    /// Where each held claim is, by `namespace/name`.
    claim_slot: HashMap<String, usize>,
    free_pods: Vec<usize>,
    free_claims: Vec<usize>,
    free_units: Vec<usize>,
    work: KeptWork,
}

/// The UIDs of the pods `claim` is reserved for.
fn consumers(claim: &ResourceClaim) -> impl Iterator<Item = &str> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|r| r.resource == "pods")
        .map(|r| r.uid.as_str())
}

/// Whether the index may read `claim`: allocated and reserved.
fn is_kept_claim(claim: &ResourceClaim) -> bool {
    allocation(claim).is_some() && consumers(claim).next().is_some()
}

impl KeptVictims {
    /// The index of `pods`, `claims` and `budgets` at `now` (pods gated by `gate` hold
    /// nominations): a full build.
    pub fn new(
        devices: &ManagedDevices,
        pods: &[Arc<Pod>],
        claims: &[Arc<ResourceClaim>],
        budgets: &[Arc<PodDisruptionBudget>],
        gate: &str,
        now: Timestamp,
    ) -> KeptVictims {
        let mut kept = KeptVictims {
            gate: gate.to_owned(),
            running: HashMap::new(),
            uid_of: HashMap::new(),
            nominated: HashMap::new(),
            members: HashMap::new(),
            claims: HashMap::new(),
            reserving: HashMap::new(),
            budgets: DisruptionBudgets::new(budgets.iter().map(AsRef::as_ref)),
            promised: HashSet::new(),
            marked: HashSet::new(),
            victims: Arc::default(),
            unit_of_pod: HashMap::new(),
            claim_slot: HashMap::new(),
            free_pods: Vec::new(),
            free_claims: Vec::new(),
            free_units: Vec::new(),
            work: KeptWork::default(),
        };
        for pod in pods {
            kept.keep_pod(&object_key(&pod.metadata), Some(pod.clone()));
        }
        for claim in claims {
            kept.keep_claim(&object_key(&claim.metadata), Some(claim.clone()));
        }
        kept.promised = kept.nominations_promised(now);
        let running = kept.running.values().map(AsRef::as_ref);
        let victims = Victims::new(
            devices,
            running,
            kept.claims.values().cloned(),
            kept.budgets.clone(),
            &kept.promised,
            now,
        );
        kept.victims = Arc::new(victims);
        kept.index_slots();
        kept
    }

    /// The index as it stands.
    pub fn victims(&self) -> Arc<Victims> {
        self.victims.clone()
    }

    /// What keeping it has cost since the full build.
    pub fn work(&self) -> KeptWork {
        self.work
    }

    /// Gone units, pods and claims waiting to be reused: what a full build would compact.
    pub fn gone(&self) -> usize {
        self.free_units.len() + self.free_pods.len() + self.free_claims.len()
    }

    /// The pod `key` (`namespace/name`) is now `pod` (`None`: deleted).
    pub fn set_pod(
        &mut self,
        devices: &ManagedDevices,
        key: &str,
        pod: Option<Arc<Pod>>,
        now: Timestamp,
    ) {
        let mut seeds: Vec<String> = self.uid_of.get(key).cloned().into_iter().collect();
        let nominated = self.nominated.contains_key(key);
        seeds.extend(pod.as_ref().and_then(|p| p.metadata.uid.clone()));
        self.keep_pod(key, pod);
        if nominated || self.nominated.contains_key(key) {
            let promised = self.nominations_promised(now);
            seeds.extend(self.promised.symmetric_difference(&promised).cloned());
            self.promised = promised;
        }
        self.changed(devices, seeds, now);
    }

    /// The claim `key` (`namespace/name`) is now `claim` (`None`: deleted).
    pub fn set_claim(
        &mut self,
        devices: &ManagedDevices,
        key: &str,
        claim: Option<Arc<ResourceClaim>>,
        now: Timestamp,
    ) {
        let mut seeds: Vec<String> = Vec::new();
        for c in self.claims.get(key).into_iter().chain(claim.as_ref()) {
            seeds.extend(consumers(c).map(str::to_owned));
        }
        self.keep_claim(key, claim);
        self.changed(devices, seeds, now);
    }

    /// The budgets are now `budgets`: which budgets cover each pod, and what each unit may lose,
    /// counted again (no pod or claim is read again).
    pub fn set_budgets(&mut self, budgets: &[Arc<PodDisruptionBudget>]) {
        self.budgets = DisruptionBudgets::new(budgets.iter().map(AsRef::as_ref));
        self.work.changes += 1;
        self.charge_budgets(true);
    }

    /// Records the newest version of a pod in the maps (not in the index).
    fn keep_pod(&mut self, key: &str, pod: Option<Arc<Pod>>) {
        if let Some(uid) = self.uid_of.remove(key)
            && let Some(old) = self.running.remove(&uid).inspect(|_| {
                self.marked.remove(&uid);
            })
            && let Some(group) = group_key(&old)
            && let Some(members) = self.members.get_mut(&group)
        {
            members.remove(&uid);
            if members.is_empty() {
                self.members.remove(&group);
            }
        }
        self.nominated.remove(key);
        let Some(pod) = pod else {
            return;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let nominated = Nomination::of(&pod).is_some();
        if nominated {
            self.nominated.insert(key.to_owned(), pod.clone());
        }
        if is_running(&pod) {
            if let Some(group) = group_key(&pod) {
                self.members.entry(group).or_default().insert(uid.clone());
            }
            if PreemptedBy::is_marked(&pod) {
                self.marked.insert(uid.clone());
            }
            self.running.insert(uid.clone(), pod);
        } else if !nominated {
            return;
        }
        self.uid_of.insert(key.to_owned(), uid);
    }

    /// Records the newest version of a claim in the maps (not in the index).
    fn keep_claim(&mut self, key: &str, claim: Option<Arc<ResourceClaim>>) {
        if let Some(old) = self.claims.remove(key) {
            for uid in consumers(&old) {
                if let Some(keys) = self.reserving.get_mut(uid) {
                    keys.remove(key);
                    if keys.is_empty() {
                        self.reserving.remove(uid);
                    }
                }
            }
        }
        let Some(claim) = claim.filter(|c| is_kept_claim(c)) else {
            return;
        };
        for uid in consumers(&claim) {
            self.reserving
                .entry(uid.to_owned())
                .or_default()
                .insert(key.to_owned());
        }
        self.claims.insert(key.to_owned(), claim);
    }

    fn nominations_promised(&self, now: Timestamp) -> HashSet<String> {
        let pods = self.nominated.values().map(AsRef::as_ref);
        Nominations::from_pods(pods, &self.gate, now).promised()
    }

    /// Indexes where each pod and claim of the index is (after a full build).
    fn index_slots(&mut self) {
        for (u, unit) in self.victims.units.iter().enumerate() {
            for &p in &unit.pods {
                self.unit_of_pod.insert(self.victims.pods[p].uid.clone(), u);
            }
        }
        for (c, claim) in self.victims.claims.iter().enumerate() {
            self.claim_slot.insert(object_key(&claim.claim.metadata), c);
        }
    }

    /// After the pods with UIDs `seeds` changed: their units, and those tied to them, built again.
    fn changed(&mut self, devices: &ManagedDevices, seeds: Vec<String>, now: Timestamp) {
        self.work.changes += 1;
        let component = self.component(seeds);
        self.work.pods_rebuilt += component.len() as u64;
        let old: BTreeSet<usize> = component
            .iter()
            .filter_map(|uid| self.unit_of_pod.get(uid).copied())
            .collect();
        for &u in &old {
            self.unlink_nodes(u);
        }
        for u in old {
            self.remove_unit(u);
        }
        self.charge_budgets(false);
        let pods: Vec<&Pod> = component
            .iter()
            .filter_map(|uid| self.running.get(uid))
            .map(AsRef::as_ref)
            .filter(|p| !is_promised(p, &self.promised))
            .collect();
        let claims: BTreeSet<&String> = component
            .iter()
            .filter_map(|uid| self.reserving.get(uid))
            .flatten()
            .collect();
        let claims = claims.into_iter().map(|k| self.claims[k].clone());
        let budgets = self.victims.budgets.clone();
        let part = Victims::assemble(devices, pods, claims, budgets, now);
        self.splice(part);
    }

    /// The UIDs of `seeds` and of every pod tied to them: in one unit (before or after the
    /// change: a gang's running members), or sharing a claim.
    fn component(&self, seeds: Vec<String>) -> BTreeSet<String> {
        let victims = &self.victims;
        let mut seen = BTreeSet::new();
        let mut queue = seeds;
        while let Some(uid) = queue.pop() {
            if seen.contains(&uid) {
                continue;
            }
            if let Some(&u) = self.unit_of_pod.get(&uid) {
                let unit = &victims.units[u];
                let tied = unit.claims.iter().flat_map(|&c| &victims.claims[c].units);
                for &t in std::iter::once(&u).chain(tied) {
                    let pods = victims.units[t].pods.iter();
                    queue.extend(pods.map(|&p| victims.pods[p].uid.clone()));
                }
            }
            if let Some(group) = self.running.get(&uid).and_then(|p| group_key(p)) {
                queue.extend(self.members.get(&group).into_iter().flatten().cloned());
            }
            for key in self.reserving.get(&uid).into_iter().flatten() {
                queue.extend(consumers(&self.claims[key]).map(str::to_owned));
            }
            seen.insert(uid);
        }
        seen
    }

    /// Removes unit `u` from the nodes where it holds devices.
    fn unlink_nodes(&mut self, u: usize) {
        let victims = Arc::make_mut(&mut self.victims);
        let claims = &victims.claims;
        let nodes: BTreeSet<usize> = victims.units[u]
            .claims
            .iter()
            .flat_map(|&c| claims[c].devices.iter().map(|(_, n)| *n))
            .collect();
        for node in nodes {
            if let Some(entries) = victims.by_node.get_mut(&node) {
                entries.retain(|&(v, _)| v != u);
                if entries.is_empty() {
                    victims.by_node.remove(&node);
                }
            }
        }
    }

    /// Removes unit `u`, its pods and its claims from the index (their places are reused).
    fn remove_unit(&mut self, u: usize) {
        let victims = Arc::make_mut(&mut self.victims);
        let unit = std::mem::replace(&mut victims.units[u], Unit::gone());
        if unit.is_gone() {
            return;
        }
        self.free_units.push(u);
        for &c in &unit.claims {
            if victims.claims[c].units.is_empty() {
                continue;
            }
            let gone = std::mem::replace(&mut victims.claims[c], gone_claim());
            self.claim_slot.remove(&object_key(&gone.claim.metadata));
            self.free_claims.push(c);
        }
        for &p in &unit.pods {
            let gone = std::mem::replace(&mut victims.pods[p], gone_pod());
            self.unit_of_pod.remove(&gone.uid);
            self.free_pods.push(p);
        }
    }

    /// Adds the units of `part` (an index of some pods, under the same budgets) to the index.
    fn splice(&mut self, part: Victims) {
        let victims = Arc::make_mut(&mut self.victims);
        let place = |free: &mut Vec<usize>, len: &mut usize| {
            free.pop().unwrap_or_else(|| {
                *len += 1;
                *len - 1
            })
        };
        let (mut pods_len, mut claims_len, mut units_len) = (
            victims.pods.len(),
            victims.claims.len(),
            victims.units.len(),
        );
        let mut pod_at: HashMap<usize, usize> = HashMap::new();
        for unit in &part.units {
            for &p in &unit.pods {
                pod_at.insert(p, place(&mut self.free_pods, &mut pods_len));
            }
        }
        let claim_at: Vec<usize> = (0..part.claims.len())
            .map(|_| place(&mut self.free_claims, &mut claims_len))
            .collect();
        let unit_at: Vec<usize> = (0..part.units.len())
            .map(|_| place(&mut self.free_units, &mut units_len))
            .collect();
        victims.pods.resize_with(pods_len, gone_pod);
        victims.claims.resize_with(claims_len, gone_claim);
        victims.units.resize_with(units_len, Unit::gone);
        for (&p, &at) in &pod_at {
            let mut pod = part.pods[p].clone();
            pod.claims = pod.claims.iter().map(|&c| claim_at[c]).collect();
            victims.pods[at] = pod;
        }
        for (c, mut claim) in part.claims.into_iter().enumerate() {
            claim.units = claim.units.iter().map(|&u| unit_at[u]).collect();
            self.claim_slot
                .insert(object_key(&claim.claim.metadata), claim_at[c]);
            victims.claims[claim_at[c]] = claim;
        }
        for (u, mut unit) in part.units.into_iter().enumerate() {
            for &p in &unit.pods {
                self.unit_of_pod
                    .insert(part.pods[p].uid.clone(), unit_at[u]);
            }
            unit.pods = unit.pods.iter().map(|p| pod_at[p]).collect();
            unit.claims = unit.claims.iter().map(|&c| claim_at[c]).collect();
            victims.units[unit_at[u]] = unit;
        }
        for (node, entries) in part.by_node {
            let at = victims.by_node.entry(node).or_default();
            at.extend(entries.into_iter().map(|(u, n)| (unit_at[u], n)));
        }
    }

    /// Charges the promised victims to the budgets again; with `coverage`, which budgets cover
    /// each pod is found again too (the budgets changed). Each unit's budgets follow.
    fn charge_budgets(&mut self, coverage: bool) {
        let promised = self
            .promised
            .union(&self.marked)
            .filter_map(|uid| self.running.get(uid))
            .map(AsRef::as_ref);
        let charged = spent(self.budgets.clone(), promised);
        if !coverage && charged == self.victims.budgets {
            return;
        }
        let victims = Arc::make_mut(&mut self.victims);
        victims.budgets = charged;
        if coverage {
            for pod in &mut victims.pods {
                if let Some(running) = self.running.get(&pod.uid) {
                    pod.budgets = victims.budgets.covering(running);
                }
            }
        }
        let per_unit: Vec<(BTreeMap<usize, u32>, _)> = victims
            .units
            .iter()
            .map(|unit| victims.unit_budgets(&unit.pods))
            .collect();
        for (unit, (budgets, blocked)) in victims.units.iter_mut().zip(per_unit) {
            unit.budgets = budgets;
            unit.blocked = blocked;
        }
    }
}

fn gone_pod() -> VictimPod {
    VictimPod {
        key: String::new(),
        uid: String::new(),
        priority: 0,
        node: String::new(),
        requests: Requests::default(),
        gpu_seconds: 0,
        grace_seconds: 0,
        budgets: Vec::new(),
        claims: Vec::new(),
    }
}

fn gone_claim() -> HeldClaim {
    HeldClaim {
        claim: Arc::default(),
        devices: Vec::new(),
        whole: false,
        units: Vec::new(),
    }
}
