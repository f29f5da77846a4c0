//! What the controller keeps across preemption searches: the victim index (`Cluster::victims`),
//! to which each change of a claim, a running pod or the budgets is applied, built again in full
//! only after a relist, an inventory change, or when too old (counted, not timed); and the pods
//! that carry a nomination (`Cluster::nominated_pods`), kept with every change.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use tessera_api::names::NOMINATION_ANNOTATION;
use tessera_controller::cluster::{Cluster, Stores, Tracked, VICTIMS_MAX_AGE};
use tessera_controller::slices::SliceCache;

const GATE: &str = "gpu.tessera.dev/topology-aware";

fn meta(name: &str, rv: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("ml".to_owned()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some(rv.to_owned()),
        ..Default::default()
    }
}

struct World {
    pods: Writer<Pod>,
    claims: Writer<ResourceClaim>,
    generation: Arc<AtomicU64>,
    cluster: Cluster,
    builds: Cell<usize>,
}

impl World {
    fn new() -> World {
        let (pod_store, pods) = reflector::store::<Pod>();
        let (claim_store, claims) = reflector::store::<ResourceClaim>();
        let stores = Stores {
            pods: pod_store,
            claims: claim_store,
            slices: Arc::new(SliceCache::default()),
            classes: reflector::store().0,
            nodes: reflector::store().0,
            templates: reflector::store().0,
            budgets: reflector::store().0,
        };
        let generation = Arc::new(AtomicU64::new(0));
        World {
            pods,
            claims,
            cluster: Cluster::new(stores, Arc::new(Tracked::default()), generation.clone()),
            generation,
            builds: Cell::new(0),
        }
    }

    /// A preemption search's read of the index; how many times it was built so far.
    fn search(&self, budgets: &[Arc<PodDisruptionBudget>], now: Timestamp) -> usize {
        let inventory = self.cluster.inventory(|| {});
        let victims = self.cluster.victims(&inventory, budgets, GATE, now, || {
            self.builds.set(self.builds.get() + 1);
        });
        assert!(victims.units.is_empty(), "no managed device is held");
        self.builds.get()
    }

    fn pod_changed(&mut self, name: &str, rv: &str, node: Option<&str>) {
        let event = Event::Apply(Pod {
            metadata: meta(name, rv),
            spec: Some(PodSpec {
                node_name: node.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.pods.apply_watcher_event(&event);
        self.cluster
            .tracked
            .pod_event(&event, &self.cluster.stores.pods);
    }

    fn apply_pod(&mut self, pod: Pod) {
        let event = Event::Apply(pod);
        self.pods.apply_watcher_event(&event);
        self.cluster
            .tracked
            .pod_event(&event, &self.cluster.stores.pods);
    }

    fn claim_changed(&mut self, name: &str, rv: &str) {
        let event = Event::Apply(ResourceClaim {
            metadata: meta(name, rv),
            ..Default::default()
        });
        self.claims.apply_watcher_event(&event);
        self.cluster
            .tracked
            .claim_event(&event, &self.cluster.stores.claims);
    }
}

fn budget(rv: &str) -> Arc<PodDisruptionBudget> {
    Arc::new(PodDisruptionBudget {
        metadata: meta("batch", rv),
        ..Default::default()
    })
}

#[test]
fn the_victim_index_is_kept_current_change_by_change_and_built_again_only_when_it_must() {
    let mut world = World::new();
    let work = |world: &World| {
        let w = world.cluster.victim_index_work();
        (w.builds, w.updates, w.changes)
    };
    let t0: Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
    let budgets = vec![budget("1")];
    assert_eq!(world.search(&budgets, t0), 1, "built at the first search");
    let soon = t0.checked_add(SignedDuration::from_secs(1)).unwrap();
    assert_eq!(world.search(&budgets, soon), 1, "kept: nothing changed");
    assert_eq!(world.search(&budgets, soon), 1, "kept for every search");
    assert_eq!(work(&world), (1, 0, 0));

    world.pod_changed("pending", "2", None);
    world.search(&budgets, soon);
    assert_eq!(work(&world), (1, 0, 0), "a pending pod is nobody's victim");
    world.pod_changed("a", "2", Some("node-0"));
    world.search(&budgets, soon);
    assert_eq!(
        work(&world),
        (1, 1, 1),
        "a running pod changed: applied, not built"
    );
    world.search(&budgets, soon);
    assert_eq!(work(&world), (1, 1, 1));
    world.claim_changed("c", "3");
    world.pod_changed("b", "3", Some("node-1"));
    world.search(&budgets, soon);
    assert_eq!(
        work(&world),
        (1, 2, 3),
        "a claim and a pod changed: both applied"
    );

    world.search(&[budget("4")], soon);
    assert_eq!(work(&world), (1, 3, 4), "a budget changed: applied");
    world.search(&[budget("4")], soon);
    world.search(&[], soon);
    assert_eq!(work(&world), (1, 4, 5), "a budget went away");

    world.generation.fetch_add(1, Ordering::AcqRel);
    assert_eq!(
        world.search(&[], soon),
        2,
        "the inventory changed: built again"
    );
    world
        .cluster
        .tracked
        .pods_listed(&world.cluster.stores.pods);
    assert_eq!(world.search(&[], soon), 3, "a relist: built again");

    let late = soon.checked_add(VICTIMS_MAX_AGE).unwrap();
    assert_eq!(
        world.search(&[], late),
        4,
        "too old: work lost follows the clock"
    );
    assert_eq!(world.search(&[], late), 4);
    assert_eq!(world.search(&[], t0), 5, "the clock went back");
    assert_eq!(work(&world).1, 4, "no update without a change");
}

#[test]
fn nominated_pods_are_listed_without_a_scan_and_follow_every_change() {
    let mut world = World::new();
    let nominated = |world: &World| -> Vec<String> {
        let mut names: Vec<String> = world
            .cluster
            .nominated_pods()
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    let pod = |name: &str, rv: &str, nominated: bool| {
        let mut metadata = meta(name, rv);
        if nominated {
            metadata.annotations = Some(
                [(NOMINATION_ANNOTATION.to_owned(), "{}".to_owned())]
                    .into_iter()
                    .collect(),
            );
        }
        Pod {
            metadata,
            ..Default::default()
        }
    };
    world.apply_pod(pod("a", "1", true));
    world.apply_pod(pod("b", "2", false));
    world.apply_pod(pod("c", "3", true));
    assert_eq!(nominated(&world), ["a", "c"]);
    world.apply_pod(pod("a", "4", false));
    assert_eq!(nominated(&world), ["c"], "the nomination was withdrawn");
    world.apply_pod(pod("b", "5", true));
    assert_eq!(nominated(&world), ["b", "c"]);
    let gone = Event::Delete(pod("c", "6", true));
    world.pods.apply_watcher_event(&gone);
    world
        .cluster
        .tracked
        .pod_event(&gone, &world.cluster.stores.pods);
    assert_eq!(nominated(&world), ["b"], "deleted");
    // A relist counts every pod again.
    world
        .cluster
        .tracked
        .pods_listed(&world.cluster.stores.pods);
    assert_eq!(nominated(&world), ["b"]);
}
