//! The controller's view of the cluster: the watch caches, the objects it wrote itself and has not
//! seen come back through a watch yet (the "assumed" objects, as kube-scheduler's assume cache
//! keeps them), what the cluster uses (devices in use, node usage: [`Tracked`], kept current from
//! the watches and the controller's own writes rather than rebuilt for every decision), and the
//! device inventory rebuilt when slices, classes or nodes change.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::names::{NOMINATION_ANNOTATION, PREEMPTED_BY_ANNOTATION};
use tessera_placement::ClusterSnapshot;
use tessera_placement::group::{GroupKey, group_key};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::pods::{CapacityWaits, UnreadableAllocation};
use tessera_placement::preemption::{KeptVictims, ManagedDevices, Victims};
use tessera_placement::protocol::is_terminal;
use tessera_placement::resources::NodeUsage;
use tessera_placement::usage::ClusterUse;

use crate::slices::{EncodedSlice, SliceCache, decode};

/// The watch caches.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub claims: Store<ResourceClaim>,
    /// Encoded (see [`crate::slices`]).
    pub slices: Arc<SliceCache>,
    pub classes: Store<DeviceClass>,
    pub nodes: Store<Node>,
    pub templates: Store<ResourceClaimTemplate>,
    /// PodDisruptionBudgets, which preemption honours.
    pub budgets: Store<PodDisruptionBudget>,
}

fn rv(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// Objects the controller wrote, newer than the watch cache until the watch catches up.
#[derive(Debug)]
pub struct Assumed<K> {
    objects: Mutex<HashMap<(String, String), Arc<K>>>,
}

impl<K> Default for Assumed<K> {
    fn default() -> Self {
        Assumed {
            objects: Mutex::new(HashMap::new()),
        }
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl<K: Resource> Assumed<K> {
    /// Remembers an object the server returned after a write.
    pub fn assume(&self, object: K) -> Arc<K> {
        let object = Arc::new(object);
        self.objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key_of(object.meta()), object.clone());
        object
    }

    /// The newer of the cached object and the assumed one (resourceVersions compared as numbers,
    /// as the scheduler's assume cache does). An assumed object the cache has caught up with, or
    /// whose object is gone from the cache, is dropped.
    pub fn newest(&self, cached: Option<Arc<K>>, namespace: &str, name: &str) -> Option<Arc<K>> {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_owned(), name.to_owned());
        let Some(assumed) = objects.get(&key) else {
            return cached;
        };
        let cached = cached?;
        let (Some(new), Some(old)) = (rv(cached.meta()), rv(assumed.meta())) else {
            objects.remove(&key);
            return Some(cached);
        };
        if new >= old {
            objects.remove(&key);
            Some(cached)
        } else {
            Some(assumed.clone())
        }
    }

    /// Every object of `cached`, each replaced by its assumed version where that is newer.
    pub fn overlay(&self, cached: Vec<Arc<K>>) -> Vec<Arc<K>> {
        if self
            .objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return cached;
        }
        cached
            .into_iter()
            .filter_map(|c| {
                let (ns, name) = key_of(c.meta());
                self.newest(Some(c), &ns, &name)
            })
            .collect()
    }

    /// Forgets everything (after losing leadership: another leader may have changed anything).
    pub fn clear(&self) {
        self.objects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// The controller's writes not seen back yet, and what the cluster uses — devices in use and node
/// usage of the newest version of every claim and pod (the cached one, or the assumed one where that
/// is newer: what [`Assumed::overlay`] gives). The watches report every change of their caches
/// ([`Tracked::claim_event`], [`Tracked::pod_event`]) and the [`Cluster`] every assumed object;
/// each report recounts the one object it names, read under the lock, so the count never falls
/// behind the caches and the assumed objects whatever order watch and worker report in.
#[derive(Default)]
pub struct Tracked {
    pub claims: Assumed<ResourceClaim>,
    pub pods: Assumed<Pod>,
    usage: Mutex<ClusterUse>,
    /// Bumped on every claim or pod change counted (under the same lock as the count): what the
    /// kept victim index is checked against ([`Cluster::victims`]).
    changes: AtomicU64,
    /// Keys (`namespace/name`) of the pods whose newest version carries a nomination, kept with
    /// the count: the devices nominated for others are found without a scan of every pod.
    nominated: Mutex<BTreeSet<String>>,
    /// The changes the kept victim index has not applied yet ([`Cluster::victims`]).
    pending: Mutex<Pending>,
}

/// Claims and pods changed since the kept victim index last applied the changes.
#[derive(Debug, Default)]
pub struct Pending {
    /// `namespace/name` of each pod changed.
    pub pods: BTreeSet<String>,
    /// `namespace/name` of each claim changed.
    pub claims: BTreeSet<String>,
    /// Every pod or claim was counted again (a relist): the index is built again.
    pub relisted: bool,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.claims.is_empty() && !self.relisted
    }
}

fn report_unreadable(u: &UnreadableAllocation) {
    tracing::warn!(claim = %u.claim, error = %u.error,
        "allocation does not parse; treating its devices as exclusively in use");
}

/// Whether `pod` carries a nomination (what [`Tracked::nominated`] lists).
fn is_nominated(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(NOMINATION_ANNOTATION))
}

/// Whether the victim index may read `pod`: bound to a node, or carrying a nomination or the mark
/// of a victim.
fn may_be_read_by_victims(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let marked = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PREEMPTED_BY_ANNOTATION));
    bound || marked || is_nominated(pod)
}

fn name_of<K: Resource>(object: &K) -> (String, String) {
    key_of(object.meta())
}

impl Tracked {
    fn usage(&self) -> MutexGuard<'_, ClusterUse> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The count, to change: the change is counted in [`Tracked::changes`] before the lock is
    /// released.
    fn change(&self) -> MutexGuard<'_, ClusterUse> {
        let usage = self.usage();
        self.changes.fetch_add(1, Ordering::AcqRel);
        usage
    }

    /// How many claim and pod changes were counted so far.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The changes the victim index has not applied yet, taken (the next call returns only what
    /// changes after this one).
    pub fn take_pending(&self) -> Pending {
        std::mem::take(&mut *self.pending())
    }

    /// After the claim watch applied `event` to `cache`.
    pub fn claim_event(&self, event: &Event<ResourceClaim>, cache: &Store<ResourceClaim>) {
        match event {
            Event::Apply(claim) | Event::Delete(claim) => {
                let (namespace, name) = name_of(claim);
                self.claim_changed(cache, &namespace, &name);
            }
            // A relist replaces the cache at its end (objects deleted meanwhile get no event).
            Event::InitDone => self.claims_listed(cache),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// After the pod watch applied `event` to `cache`.
    pub fn pod_event(&self, event: &Event<Pod>, cache: &Store<Pod>) {
        match event {
            Event::Apply(pod) | Event::Delete(pod) => {
                let (namespace, name) = name_of(pod);
                self.pod_changed(cache, &namespace, &name);
            }
            Event::InitDone => self.pods_listed(cache),
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// The claim `namespace/name` changed in `cache` or was assumed: its newest version counts.
    pub fn claim_changed(&self, cache: &Store<ResourceClaim>, namespace: &str, name: &str) {
        let mut usage = self.change();
        let cached = cache.get(&ObjectRef::new(name).within(namespace));
        let newest = self.claims.newest(cached, namespace, name);
        let key = format!("{namespace}/{name}");
        self.pending().claims.insert(key.clone());
        if let Some(u) = usage.set_claim(&key, newest.as_deref()) {
            report_unreadable(&u);
        }
    }

    /// The pod `namespace/name` changed in `cache` or was assumed: its newest version counts.
    /// A change to a pending pod that is neither nominated nor marked (nor was nominated) is not
    /// counted in [`Tracked::changes`] nor left for the victim index: the index reads only running
    /// pods and those marks. A pod whose nomination was withdrawn is: its victims are others'
    /// again.
    pub fn pod_changed(&self, cache: &Store<Pod>, namespace: &str, name: &str) {
        let mut usage = self.usage();
        let cached = cache.get(&ObjectRef::new(name).within(namespace));
        let newest = self.pods.newest(cached, namespace, name);
        let key = format!("{namespace}/{name}");
        let was_nominated = self.note_nomination(&key, newest.as_deref());
        if was_nominated || newest.as_deref().is_none_or(may_be_read_by_victims) {
            self.changes.fetch_add(1, Ordering::AcqRel);
            self.pending().pods.insert(key.clone());
        }
        usage.set_pod(&key, newest.as_deref());
    }

    /// Records whether the pod `key` (newest version `pod`) carries a nomination; whether it
    /// carried one before.
    fn note_nomination(&self, key: &str, pod: Option<&Pod>) -> bool {
        let mut nominated = self.nominated.lock().unwrap_or_else(|e| e.into_inner());
        if pod.is_some_and(is_nominated) {
            !nominated.insert(key.to_owned())
        } else {
            nominated.remove(key)
        }
    }

    /// Keys of the pods whose newest version carries a nomination.
    pub fn nominated(&self) -> Vec<String> {
        let nominated = self.nominated.lock().unwrap_or_else(|e| e.into_inner());
        nominated.iter().cloned().collect()
    }

    /// Counts every claim of `cache` again (after a relist, or after the assumed ones were
    /// forgotten).
    pub fn claims_listed(&self, cache: &Store<ResourceClaim>) {
        let mut usage = self.change();
        self.pending().relisted = true;
        let claims = self.claims.overlay(cache.state());
        for u in usage.rebuild_claims(claims.iter().map(|c| &**c)) {
            report_unreadable(&u);
        }
    }

    /// Counts every pod of `cache` again.
    pub fn pods_listed(&self, cache: &Store<Pod>) {
        let mut usage = self.change();
        self.pending().relisted = true;
        let pods = self.pods.overlay(cache.state());
        let nominated: BTreeSet<String> = pods
            .iter()
            .filter(|p| is_nominated(p))
            .map(|p| key_of(&p.metadata))
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect();
        *self.nominated.lock().unwrap_or_else(|e| e.into_inner()) = nominated;
        usage.rebuild_pods(pods.iter().map(|p| &**p));
    }
}

/// The devices and node facts of one generation of slices, classes and nodes.
pub struct InventorySnapshot {
    pub generation: u64,
    /// Topology-managed devices, nodes with them, every node's facts.
    pub devices: ClusterSnapshot,
    unmanaged: OnceLock<Arc<DeviceIndex>>,
    /// The managed devices by pool, for the victim index (built at the first preemption search).
    managed: OnceLock<ManagedDevices>,
    slices: Vec<EncodedSlice>,
    classes: Vec<DeviceClass>,
}

impl InventorySnapshot {
    fn build(generation: u64, stores: &Stores) -> InventorySnapshot {
        let slices = stores.slices.encoded();
        let classes: Vec<DeviceClass> = stores
            .classes
            .state()
            .iter()
            .map(|c| (**c).clone())
            .collect();
        let nodes: Vec<NodeFacts> = stores
            .nodes
            .state()
            .iter()
            .map(|n| NodeFacts::from(&**n))
            .collect();
        InventorySnapshot {
            generation,
            devices: ClusterSnapshot::new(decode(&slices), classes.clone(), nodes),
            unmanaged: OnceLock::new(),
            managed: OnceLock::new(),
            slices,
            classes,
        }
    }

    /// The devices the scheduler allocates (built on first use, from the encoded slices).
    pub fn unmanaged(&self) -> Arc<DeviceIndex> {
        self.unmanaged
            .get_or_init(|| {
                Arc::new(
                    self.devices
                        .unmanaged(decode(&self.slices), self.classes.clone()),
                )
            })
            .clone()
    }

    /// The managed devices by pool (built on first use).
    pub fn managed(&self) -> &ManagedDevices {
        self.managed
            .get_or_init(|| ManagedDevices::new(&self.devices))
    }
}

/// How long a kept victim index serves when nothing changed: its work-lost figures and which
/// nominations stand follow the clock.
pub const VICTIMS_MAX_AGE: SignedDuration = SignedDuration::from_secs(10);

/// The victim index kept across decisions ([`Cluster::victims`]): the inventory generation it
/// resolves devices in, the budgets' versions it counts, when it was last built in full.
struct KeptIndex {
    inventory: u64,
    budgets: u64,
    built: Timestamp,
    index: KeptVictims,
}

/// How the kept victim index was brought up to date, counted (what the tests check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimIndexWork {
    /// Full builds from every pod and claim.
    pub builds: u64,
    /// Searches that applied pending changes to the kept index instead.
    pub updates: u64,
    /// Pod and claim changes applied, budget changes included.
    pub changes: u64,
}

/// A fingerprint of the budgets' identities and versions.
fn budgets_fingerprint(budgets: &[Arc<PodDisruptionBudget>]) -> u64 {
    let mut versions: Vec<(&str, &str)> = budgets
        .iter()
        .map(|b| {
            let meta = &b.metadata;
            (
                meta.uid.as_deref().unwrap_or_default(),
                meta.resource_version.as_deref().unwrap_or_default(),
            )
        })
        .collect();
    versions.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    versions.hash(&mut hasher);
    hasher.finish()
}

/// The view the worker decides from.
pub struct Cluster {
    pub stores: Stores,
    /// The assumed objects and what the cluster uses (shared with the watches).
    pub tracked: Arc<Tracked>,
    /// Bumped by the watches whenever slices, classes or nodes change.
    pub inventory_generation: Arc<AtomicU64>,
    snapshot: Mutex<Option<Arc<InventorySnapshot>>>,
    /// The victim index of the last preemption search ([`Cluster::victims`]).
    victims: Mutex<Option<KeptIndex>>,
    victim_work: Mutex<VictimIndexWork>,
}

impl Cluster {
    /// The view of `stores`, whose watches report their changes to `tracked`.
    pub fn new(
        stores: Stores,
        tracked: Arc<Tracked>,
        inventory_generation: Arc<AtomicU64>,
    ) -> Cluster {
        Cluster {
            stores,
            tracked,
            inventory_generation,
            snapshot: Mutex::new(None),
            victims: Mutex::new(None),
            victim_work: Mutex::new(VictimIndexWork::default()),
        }
    }

    /// The inventory of the current generation; `rebuilt` is told when it had to be built.
    pub fn inventory(&self, rebuilt: impl FnOnce()) -> Arc<InventorySnapshot> {
        let generation = self.inventory_generation.load(Ordering::Acquire);
        let mut snapshot = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = snapshot.as_ref().filter(|s| s.generation == generation) {
            return s.clone();
        }
        rebuilt();
        // Free the outdated inventory before building the new one: a large cluster's inventory
        // is the controller's biggest object, and two of them would double the peak.
        *snapshot = None;
        let built = Arc::new(InventorySnapshot::build(generation, &self.stores));
        *snapshot = Some(built.clone());
        built
    }

    /// The victim index of the pods, claims and `budgets` on `inventory` at `now` (pods gated by
    /// `gate` hold nominations), kept across decisions: the claim and pod changes counted since
    /// the last search, and a change of the budgets, are applied to it ([`KeptVictims`]); it is
    /// built again in full (`rebuilt` told) the first time, after a relist, when the inventory
    /// changed, or when it is older than [`VICTIMS_MAX_AGE`]. The pending changes are taken
    /// before the objects are read, so a change made meanwhile is applied again at the next
    /// search.
    pub fn victims(
        &self,
        inventory: &InventorySnapshot,
        budgets: &[Arc<PodDisruptionBudget>],
        gate: &str,
        now: Timestamp,
        rebuilt: impl FnOnce(),
    ) -> Arc<Victims> {
        let fingerprint = budgets_fingerprint(budgets);
        let mut kept = self.victims.lock().unwrap_or_else(|e| e.into_inner());
        let pending = self.tracked.take_pending();
        let usable = |k: &KeptIndex| {
            k.inventory == inventory.generation
                && !pending.relisted
                && k.built <= now
                && now.duration_since(k.built) < VICTIMS_MAX_AGE
        };
        let mut work = self.victim_work.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.as_mut().filter(|k| usable(k)) {
            if pending.is_empty() && k.budgets == fingerprint {
                return k.index.victims();
            }
            let before = k.index.work().changes;
            self.apply(k, inventory.managed(), pending, now);
            if k.budgets != fingerprint {
                k.index.set_budgets(budgets);
                k.budgets = fingerprint;
            }
            work.updates += 1;
            work.changes += k.index.work().changes - before;
            return k.index.victims();
        }
        rebuilt();
        work.builds += 1;
        *kept = None;
        let index = KeptVictims::new(
            inventory.managed(),
            &self.pods(),
            &self.claims(),
            budgets,
            gate,
            now,
        );
        let victims = index.victims();
        *kept = Some(KeptIndex {
            inventory: inventory.generation,
            budgets: fingerprint,
            built: now,
            index,
        });
        victims
    }

    /// Applies the `pending` pod and claim changes (their newest versions) to `kept`.
    fn apply(
        &self,
        kept: &mut KeptIndex,
        devices: &ManagedDevices,
        pending: Pending,
        now: Timestamp,
    ) {
        for key in &pending.pods {
            let pod = key
                .split_once('/')
                .and_then(|(ns, name)| self.pod(ns, name));
            kept.index.set_pod(devices, key, pod, now);
        }
        for key in &pending.claims {
            let claim = key
                .split_once('/')
                .and_then(|(ns, name)| self.claim(ns, name));
            kept.index.set_claim(devices, key, claim, now);
        }
    }

    /// How the kept victim index was brought up to date so far.
    pub fn victim_index_work(&self) -> VictimIndexWork {
        *self.victim_work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pods that carry a nomination, newest versions (found without a scan of every pod).
    pub fn nominated_pods(&self) -> Vec<Arc<Pod>> {
        self.tracked
            .nominated()
            .iter()
            .filter_map(|key| {
                let (namespace, name) = key.split_once('/')?;
                self.pod(namespace, name)
            })
            .collect()
    }

    /// A pod, newest version.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        let cached = self
            .stores
            .pods
            .get(&ObjectRef::new(name).within(namespace));
        self.tracked.pods.newest(cached, namespace, name)
    }

    /// Every pod, newest versions (preemption's victims and nominations).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.tracked.pods.overlay(self.stores.pods.state())
    }

    /// Every claim, newest versions.
    pub fn claims(&self) -> Vec<Arc<ResourceClaim>> {
        self.tracked.claims.overlay(self.stores.claims.state())
    }

    /// Every PodDisruptionBudget.
    pub fn budgets(&self) -> Vec<Arc<PodDisruptionBudget>> {
        self.stores.budgets.state()
    }

    /// A claim, newest version.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        let cached = self
            .stores
            .claims
            .get(&ObjectRef::new(name).within(namespace));
        self.tracked.claims.newest(cached, namespace, name)
    }

    /// Remembers a claim the server returned after a write, and counts it.
    pub fn assume_claim(&self, claim: ResourceClaim) -> Arc<ResourceClaim> {
        let (namespace, name) = name_of(&claim);
        let claim = self.tracked.claims.assume(claim);
        self.tracked
            .claim_changed(&self.stores.claims, &namespace, &name);
        claim
    }

    /// Remembers a pod the server returned after a write, and counts it.
    pub fn assume_pod(&self, pod: Pod) -> Arc<Pod> {
        let (namespace, name) = name_of(&pod);
        let pod = self.tracked.pods.assume(pod);
        self.tracked
            .pod_changed(&self.stores.pods, &namespace, &name);
        pod
    }

    /// Forgets every assumed object (after gaining leadership: another leader may have changed
    /// anything meanwhile) and counts the cached ones again.
    pub fn forget_assumed(&self) {
        self.tracked.claims.clear();
        self.tracked.pods.clear();
        self.tracked.claims_listed(&self.stores.claims);
        self.tracked.pods_listed(&self.stores.pods);
    }

    /// Whether a ResourceClaimTemplate exists.
    pub fn template_exists(&self, namespace: &str, name: &str) -> bool {
        self.stores
            .templates
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    /// The pods of a group that still matter: not deleted, not finished.
    pub fn group_pods(&self, key: &GroupKey) -> Vec<Arc<Pod>> {
        let pods = self.tracked.pods.overlay(self.stores.pods.state());
        pods.into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                    && p.metadata.deletion_timestamp.is_none()
                    && !is_terminal(p)
                    && group_key(p).as_ref() == Some(key)
            })
            .collect()
    }

    /// The pods that wait for room, at `now` ([`CapacityWaits`]): what the capacity metrics
    /// report.
    pub fn capacity_waits(&self, gate: &str, now: Timestamp) -> CapacityWaits {
        let pods = self.tracked.pods.overlay(self.stores.pods.state());
        CapacityWaits::of(pods.iter().map(|p| &**p), gate, now)
    }

    /// Every device allocated by any claim ([`tessera_placement::pods::devices_in_use`]; a claim
    /// whose allocation does not parse blocks its devices exclusively, and is logged when seen).
    pub fn devices_in_use(&self) -> Arc<AllocatedState> {
        self.tracked.usage().devices_in_use()
    }

    /// What the pods on each node request, except the pod with UID `except` (the pod being
    /// placed; `""`: none). Pods the controller released but the scheduler has not bound yet count
    /// on their placement node ([`tessera_placement::pods::node_usage`]).
    pub fn node_usage(&self, except: &str) -> Arc<HashMap<String, NodeUsage>> {
        let usage = self.tracked.usage();
        if except.is_empty() {
            usage.node_usage()
        } else {
            usage.node_usage_except(except)
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn claim(name: &str, rv: &str) -> Arc<ResourceClaim> {
        Arc::new(ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[test]
    fn assumed_objects_win_until_the_cache_catches_up() {
        let assumed = Assumed::default();
        assumed.assume((*claim("a", "10")).clone());
        let seen = assumed.newest(Some(claim("a", "9")), "ns", "a").unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("10"));
        let overlay = assumed.overlay(vec![claim("a", "9"), claim("b", "3")]);
        let versions: Vec<_> = overlay
            .iter()
            .map(|c| c.metadata.resource_version.clone().unwrap())
            .collect();
        assert_eq!(versions, ["10", "3"]);
        // The watch delivered version 11: the assumed copy is dropped.
        let seen = assumed.newest(Some(claim("a", "11")), "ns", "a").unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("11"));
        let seen = assumed.newest(Some(claim("a", "9")), "ns", "a").unwrap();
        assert_eq!(
            seen.metadata.resource_version.as_deref(),
            Some("9"),
            "forgotten once caught up"
        );
        // Deleted from the cache: gone.
        assumed.assume((*claim("c", "5")).clone());
        assert!(assumed.newest(None, "ns", "c").is_none());
    }
}
