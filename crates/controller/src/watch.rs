//! The watches: one per resource, each filling a reflector store with trimmed objects and telling
//! the work queue what changed — a candidate pod (queue it), something a waiting pod may be
//! waiting for (wake parked pods), or the devices, classes or nodes (rebuild the inventory) — and
//! telling [`Tracked`] which claim or pod changed (what the cluster uses is kept current).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Affinity, Node, Pod, PodResourceClaim, PodResourceClaimStatus, PodSchedulingGate, Toleration,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::cluster::{Stores, Tracked};
use crate::queue::{Rank, WorkQueue};
use crate::slices::SliceCache;
use crate::trim;
use tessera_placement::nodes::NodeFacts;
use tessera_placement::pods::{is_candidate, pod_usage_requests, usage_node};
use tessera_placement::preemption::pod_priority;
use tessera_placement::protocol::{ClaimMark, POD_PLACEMENT_ANNOTATION};
use tessera_placement::resources::Requests;

/// Number of watches ([`Stores`] fields).
pub const WATCHES: usize = 7;

/// What the watches tell the worker.
pub struct Signals {
    pub queue: Mutex<WorkQueue>,
    /// Woken when the queue gained work or the cluster changed.
    pub wake: Notify,
    /// Bumped when slices, classes or nodes changed.
    pub inventory_generation: Arc<AtomicU64>,
    /// Watches that completed their first list.
    pub synced: AtomicUsize,
    /// Whether the device inventory was built once from the synced caches (`/readyz` waits for it).
    pub inventory_built: AtomicBool,
    /// The scheduling gate of candidate pods.
    pub gate: String,
}

impl Signals {
    pub fn new(gate: &str) -> Signals {
        Signals {
            queue: Mutex::new(WorkQueue::new()),
            wake: Notify::new(),
            inventory_generation: Arc::new(AtomicU64::new(0)),
            synced: AtomicUsize::new(0),
            inventory_built: AtomicBool::new(false),
            gate: gate.to_owned(),
        }
    }

    /// Whether every watch has listed once.
    pub fn is_synced(&self) -> bool {
        self.synced_watches() >= WATCHES
    }

    /// How many watches have completed their first list.
    pub fn synced_watches(&self) -> usize {
        self.synced.load(Ordering::Acquire)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, WorkQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enqueue(&self, key: String) {
        crate::timing::at(&key, "queued");
        self.queue().add(&key);
        self.wake.notify_one();
    }

    /// Queues a pod in its place in line ([`Rank`]: priority, then arrival).
    fn enqueue_pod(&self, pod: &Pod) {
        let key = key(&pod.metadata);
        crate::timing::at(&key, "queued");
        let arrival = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second());
        let rank = Rank::new(pod_priority(pod), arrival);
        self.queue().add_ranked(&key, rank);
        self.wake.notify_one();
    }

    fn forget(&self, key: &str) {
        self.queue().forget(key);
    }

    fn cluster_changed(&self) {
        self.queue().cluster_changed();
        self.wake.notify_one();
    }

    fn inventory_changed(&self) {
        self.inventory_generation.fetch_add(1, Ordering::AcqRel);
        self.cluster_changed();
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    tessera_placement::protocol::object_key(meta)
}

/// The fields whose change means a candidate pod must be looked at again: its gates (another
/// component's removed, e.g. Kueue admitting the pod) and the scheduling directives that may
/// change while it is gated (Kueue adds its flavor's nodeSelector and tolerations in the same
/// write that removes its gates).
#[derive(PartialEq)]
struct PodWork<'p> {
    uid: Option<&'p str>,
    gates: Option<&'p Vec<PodSchedulingGate>>,
    node_selector: Option<&'p BTreeMap<String, String>>,
    affinity: Option<&'p Affinity>,
    tolerations: Option<&'p Vec<Toleration>>,
    claims: Option<&'p Vec<PodResourceClaim>>,
    statuses: Option<&'p Vec<PodResourceClaimStatus>>,
    placement: Option<&'p String>,
}

fn pod_work<'p>(pod: &'p Pod, gate: &str) -> Option<PodWork<'p>> {
    is_candidate(pod, gate).then(|| PodWork {
        uid: pod.metadata.uid.as_deref(),
        gates: pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()),
        node_selector: pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()),
        affinity: pod.spec.as_ref().and_then(|s| s.affinity.as_ref()),
        tolerations: pod.spec.as_ref().and_then(|s| s.tolerations.as_ref()),
        claims: pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()),
        statuses: pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref()),
        placement: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_PLACEMENT_ANNOTATION)),
    })
}

fn pod_usage(pod: &Pod) -> (Option<String>, Requests) {
    (usage_node(pod), pod_usage_requests(pod))
}

fn on_pod(signals: &Signals, event: &Event<Pod>, old: Option<Arc<Pod>>, store: &Store<Pod>) {
    match event {
        Event::Apply(pod) | Event::InitApply(pod) => {
            let old_work = old.as_deref().and_then(|o| pod_work(o, &signals.gate));
            match pod_work(pod, &signals.gate) {
                Some(work) if old_work.as_ref() != Some(&work) => signals.enqueue_pod(pod),
                None if old_work.is_some() => signals.forget(&key(&pod.metadata)),
                _ => {}
            }
            let usage = pod_usage(pod);
            if old.as_deref().map(pod_usage) != Some(usage.clone())
                && (usage.0.is_some() || old.is_some())
            {
                signals.cluster_changed();
            }
        }
        Event::Delete(pod) => {
            signals.forget(&key(&pod.metadata));
            if usage_node(pod).is_some() {
                signals.cluster_changed();
            }
        }
        Event::InitDone => {
            for pod in store.state() {
                if is_candidate(&pod, &signals.gate) {
                    signals.enqueue_pod(&pod);
                }
            }
            signals.cluster_changed();
        }
        Event::Init => {}
    }
}

fn on_claim(
    signals: &Signals,
    event: &Event<ResourceClaim>,
    old: Option<Arc<ResourceClaim>>,
    pods: &Store<Pod>,
) {
    let claim = match event {
        Event::Apply(c) | Event::InitApply(c) => c,
        Event::Delete(_) | Event::InitDone => {
            signals.cluster_changed();
            return;
        }
        Event::Init => return,
    };
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    if old.is_none() && matches!(event, Event::Apply(_)) {
        crate::timing::at(&key(&claim.metadata), "claim-seen");
    }
    let pod = |name: &str| pods.get(&ObjectRef::new(name).within(&namespace));
    // A released pod whose claim lost the allocation the controller wrote: the scheduler gave it
    // back. (Gated pods are not woken: the controller's own undo passes through that state.)
    if let Some(mark) = ClaimMark::of(claim)
        && tessera_placement::claims::allocation(claim).is_none()
        && old
            .as_deref()
            .and_then(tessera_placement::claims::allocation)
            .is_some()
        && pod(&mark.pod).is_some_and(|p| {
            is_candidate(&p, &signals.gate)
                && !tessera_placement::protocol::is_gated(&p, &signals.gate)
        })
    {
        signals.enqueue(format!("{namespace}/{}", mark.pod));
    }
    // A claim generated for a pod that may be waiting for it.
    if old.is_none()
        && let Some(owner) = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod" && o.controller == Some(true))
        && pod(&owner.name).is_some_and(|p| is_candidate(&p, &signals.gate))
    {
        signals.enqueue(format!("{namespace}/{}", owner.name));
    }
    // A claim that pods name directly (created with them, its watch event arriving after theirs):
    // such pods may be waiting for it, and without this they would wait out their backoff.
    if old.is_none()
        && matches!(event, Event::Apply(_))
        && let Some(name) = claim.metadata.name.as_deref()
    {
        for waiting in pods.state().iter().filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && names_claim(p, name)
                && is_candidate(p, &signals.gate)
        }) {
            signals.enqueue(key(&waiting.metadata));
        }
    }
    signals.cluster_changed();
}

/// Whether the pod names the claim `claim` directly (`resourceClaimName`).
fn names_claim(pod: &Pod, claim: &str) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .any(|c| c.resource_claim_name.as_deref() == Some(claim))
}

fn on_inventory_input<K>(signals: &Signals, event: &Event<K>) {
    match event {
        Event::Apply(_) | Event::Delete(_) | Event::InitDone => signals.inventory_changed(),
        Event::Init | Event::InitApply(_) => {}
    }
}

fn on_node(signals: &Signals, event: &Event<Node>, old: Option<Arc<Node>>) {
    match event {
        Event::Apply(node) => {
            if old.as_deref().map(NodeFacts::from) != Some(NodeFacts::from(node)) {
                signals.inventory_changed();
            }
        }
        Event::Delete(_) | Event::InitDone => signals.inventory_changed(),
        Event::Init | Event::InitApply(_) => {}
    }
}

/// Counts a watch as synced after its first complete list.
fn mark_synced<K>(signals: &Signals, event: &Event<K>, synced: &mut bool) {
    if matches!(event, Event::InitDone) && !*synced {
        *synced = true;
        signals.synced.fetch_add(1, Ordering::AcqRel);
        signals.wake.notify_one();
    }
}

/// Drives the slice watch into the encoded slice cache.
async fn drive_slices<S>(stream: S, cache: Arc<SliceCache>, signals: Arc<Signals>)
where
    S: Stream<Item = Result<Event<ResourceSlice>, watcher::Error>> + Send,
{
    let mut synced = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(kind = "ResourceSlice", error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        cache.apply(&event);
        on_inventory_input(&signals, &event);
        mark_synced(&signals, &event, &mut synced);
    }
}

/// Drives one watch into its store, calling `on_event` after each event is applied with the
/// object's previous cached version.
async fn drive<K, S>(
    stream: S,
    mut writer: Writer<K>,
    signals: Arc<Signals>,
    mut on_event: impl FnMut(&Event<K>, Option<Arc<K>>, &Store<K>) + Send,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send,
{
    let reader = writer.as_reader();
    let mut synced = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying with backoff");
                continue;
            }
        };
        let old = match &event {
            Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                reader.get(&ObjectRef::from_obj(o))
            }
            Event::Init | Event::InitDone => None,
        };
        writer.apply_watcher_event(&event);
        on_event(&event, old, &reader);
        mark_synced(&signals, &event, &mut synced);
    }
}

/// Slices per list page. A page is decoded whole before its slices go into the cache one by one,
/// and the memory of that transient peak stays with the process (glibc keeps it in the watch
/// thread's arena): kube's default of 500 dgx-h100 slices is tens of MiB, 50 a few.
const SLICE_PAGE_SIZE: u32 = 50;

fn watch_stream<K>(
    client: &Client,
    trim: fn(&mut K),
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let mut config = watcher::Config::default().any_semantic();
    if K::kind(&()) == "ResourceSlice" {
        config = config.page_size(SLICE_PAGE_SIZE);
    }
    watcher::watcher(api, config).default_backoff().modify(trim)
}

/// Tells the queue the cluster changed on every change after the first list (claim templates,
/// PodDisruptionBudgets).
fn on_change<K>(
    signals: &Arc<Signals>,
) -> impl FnMut(&Event<K>, Option<Arc<K>>, &Store<K>) + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let signals = signals.clone();
    move |e, _, _| {
        if !matches!(e, Event::Init | Event::InitApply(_)) {
            signals.cluster_changed();
        }
    }
}

/// The PodDisruptionBudgets' store and its watch. A budget that allows a disruption again may let
/// a waiting preemptor evict: every change wakes the queue.
fn budget_watch(
    client: &Client,
    signals: &Arc<Signals>,
) -> (
    Store<PodDisruptionBudget>,
    impl Future<Output = ()> + Send + use<>,
) {
    let (budgets, writer) = reflector::store::<PodDisruptionBudget>();
    let watch = drive(
        watch_stream(client, trim::budget),
        writer,
        signals.clone(),
        on_change(signals),
    );
    (budgets, watch)
}

/// A watch, driving its store until dropped.
pub type WatchTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Starts the seven watches, which report claim and pod changes to `tracked`. The returned futures
/// run until dropped.
pub fn start(
    client: &Client,
    signals: &Arc<Signals>,
    tracked: &Arc<Tracked>,
) -> (Stores, Vec<WatchTask>) {
    let (pods, pods_writer) = reflector::store::<Pod>();
    let (claims, claims_writer) = reflector::store::<ResourceClaim>();
    let slices = Arc::new(SliceCache::default());
    let (classes, classes_writer) = reflector::store::<DeviceClass>();
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (templates, templates_writer) = reflector::store::<ResourceClaimTemplate>();
    let (budgets, budget_watch) = budget_watch(client, signals);
    let stores = Stores {
        pods: pods.clone(),
        claims,
        slices: slices.clone(),
        classes,
        nodes,
        templates,
        budgets,
    };
    // Counted before the worker is told: a pod it wakes for decides from the new count.
    let s = signals.clone();
    let t = tracked.clone();
    let pod_watch = drive(
        watch_stream(client, trim::pod),
        pods_writer,
        signals.clone(),
        move |e, old, store| {
            t.pod_event(e, store);
            on_pod(&s, e, old, store);
        },
    );
    let s = signals.clone();
    let t = tracked.clone();
    let claim_watch = drive(
        watch_stream(client, trim::claim),
        claims_writer,
        signals.clone(),
        move |e, old, store| {
            t.claim_event(e, store);
            on_claim(&s, e, old, &pods);
        },
    );
    let slice_watch = drive_slices(watch_stream(client, trim::slice), slices, signals.clone());
    let s = signals.clone();
    let class_watch = drive(
        watch_stream(client, trim::class),
        classes_writer,
        signals.clone(),
        move |e, _, _| on_inventory_input(&s, e),
    );
    let s = signals.clone();
    let node_watch = drive(
        watch_stream(client, trim::node),
        nodes_writer,
        signals.clone(),
        move |e, old, _| on_node(&s, e, old),
    );
    let template_watch = drive(
        watch_stream(client, trim::template),
        templates_writer,
        signals.clone(),
        on_change(signals),
    );
    let tasks: Vec<WatchTask> = vec![
        Box::pin(pod_watch),
        Box::pin(claim_watch),
        Box::pin(slice_watch),
        Box::pin(class_watch),
        Box::pin(node_watch),
        Box::pin(template_watch),
        Box::pin(budget_watch),
    ];
    (stores, tasks)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tessera_api::names::TOPOLOGY_AWARE_GATE;

    use super::*;
    use crate::queue::Processed;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ml".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        }
    }

    fn gated_pod(name: &str, claim: &str) -> Pod {
        Pod {
            metadata: meta(name),
            spec: Some(PodSpec {
                scheduling_gates: Some(vec![PodSchedulingGate {
                    name: TOPOLOGY_AWARE_GATE.into(),
                }]),
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpus".into(),
                    resource_claim_name: Some(claim.into()),
                    resource_claim_template_name: None,
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_new_claim_wakes_the_parked_pods_naming_it_at_once() {
        let signals = Signals::new(TOPOLOGY_AWARE_GATE);
        let (pods, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&Event::Apply(gated_pod("waiting", "its-claim")));
        writer.apply_watcher_event(&Event::Apply(gated_pod("other", "other-claim")));
        let now = Instant::now();
        // Both pods were processed before their claims were seen, and parked.
        for key in ["ml/waiting", "ml/other"] {
            signals.queue().add(key);
        }
        for _ in 0..2 {
            let key = signals.queue().pop(now).expect("queued");
            signals.queue().done(&key, Processed::Park, now);
        }
        let claim = ResourceClaim {
            metadata: meta("its-claim"),
            ..Default::default()
        };
        on_claim(&signals, &Event::Apply(claim.clone()), None, &pods);
        // Due now, not after the park's backoff; the pod naming another claim stays parked.
        assert_eq!(signals.queue().pop(now).as_deref(), Some("ml/waiting"));
        assert_eq!(signals.queue().pop(now), None);
        // An update of a claim already seen wakes nobody at once.
        signals.queue().done("ml/waiting", Processed::Park, now);
        on_claim(
            &signals,
            &Event::Apply(claim.clone()),
            Some(Arc::new(claim)),
            &pods,
        );
        assert_eq!(signals.queue().pop(now), None);
    }
}
