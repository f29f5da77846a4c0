//! What the cluster uses, kept current from watch events and the controller's own writes
//! (`cluster::Tracked`), equals what `tessera_placement::pods::{devices_in_use, node_usage}`
//! rebuild from the caches with the assumed objects laid over them — after every step of seeded
//! random sequences of claim and pod changes, deletions, relists (objects deleted meanwhile get no
//! event), writes assumed newer or older than the cache, and leadership changes (assumed objects
//! forgotten). The claims' allocations mix exclusive, shared (share ids, consumed capacity),
//! admin-access and unreadable results on a few devices, so claims overlap; the pods are bound,
//! gated, released by the controller, finished or pending, on a few nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSchedulingGate, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use tessera_controller::cluster::{Cluster, Stores, Tracked};
use tessera_controller::slices::SliceCache;
use tessera_placement::pods::{devices_in_use, node_usage};
use tessera_placement::protocol::{POD_PLACEMENT_ANNOTATION, PodPlacement};
use tessera_test_support::SplitMix64;

const NAMES: u64 = 6;

fn meta(name: &str, rv: u64) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("ml".to_owned()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some(rv.to_string()),
        ..Default::default()
    }
}

fn result(rng: &mut SplitMix64, index: u64) -> DeviceRequestAllocationResult {
    let mut r = DeviceRequestAllocationResult {
        driver: "gpu.tessera.dev".to_owned(),
        pool: format!("node-{}", rng.below(2)),
        device: format!("gpu-{}", rng.below(4)),
        request: format!("r{index}"),
        ..Default::default()
    };
    match rng.below(6) {
        0 => r.admin_access = Some(true),
        1 | 2 => {}
        _ => {
            r.share_id = Some(format!("share-{}", rng.below(3)));
            let amount = if rng.chance(0.1) {
                "lots".to_owned()
            } else {
                format!("{}Gi", 1 + rng.below(4))
            };
            r.consumed_capacity = Some(BTreeMap::from([("memory".to_owned(), Quantity(amount))]));
        }
    }
    r
}

fn random_claim(rng: &mut SplitMix64, name: &str, rv: u64) -> ResourceClaim {
    let allocation = rng.chance(0.75).then(|| AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some((0..1 + rng.below(3)).map(|i| result(rng, i)).collect()),
            config: None,
        }),
        ..Default::default()
    });
    ResourceClaim {
        metadata: meta(name, rv),
        status: Some(ResourceClaimStatus {
            allocation,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn random_pod(rng: &mut SplitMix64, name: &str, rv: u64) -> Pod {
    let node = format!("node-{}", rng.below(3));
    let requests = BTreeMap::from([
        ("cpu".to_owned(), Quantity(format!("{}", 1 + rng.below(4)))),
        ("memory".to_owned(), Quantity(format!("{}Gi", rng.below(3)))),
    ]);
    let mut spec = PodSpec {
        containers: vec![Container {
            name: "c".to_owned(),
            resources: Some(ResourceRequirements {
                requests: Some(requests),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut metadata = meta(name, rv);
    let placement = PodPlacement {
        node: node.clone(),
        ..Default::default()
    };
    let annotations = BTreeMap::from([(
        POD_PLACEMENT_ANNOTATION.to_owned(),
        placement.to_annotation(),
    )]);
    let mut status = None;
    match rng.below(5) {
        0 => spec.node_name = Some(node),
        1 => {
            spec.scheduling_gates = Some(vec![PodSchedulingGate {
                name: "gpu.tessera.dev/topology-aware".to_owned(),
            }]);
            metadata.annotations = Some(annotations);
        }
        2 => metadata.annotations = Some(annotations),
        3 => {
            spec.node_name = Some(node);
            status = Some(PodStatus {
                phase: Some("Succeeded".to_owned()),
                ..Default::default()
            });
        }
        _ => {}
    }
    Pod {
        metadata,
        spec: Some(spec),
        status,
    }
}

/// The watch caches, the cluster over them, and the next resourceVersion.
struct World {
    rng: SplitMix64,
    rv: u64,
    claims: Writer<ResourceClaim>,
    pods: Writer<Pod>,
    cluster: Cluster,
}

impl World {
    fn new(seed: u64) -> World {
        let (claim_store, claims) = reflector::store::<ResourceClaim>();
        let (pod_store, pods) = reflector::store::<Pod>();
        let stores = Stores {
            pods: pod_store,
            claims: claim_store,
            slices: Arc::new(SliceCache::default()),
            classes: reflector::store().0,
            nodes: reflector::store().0,
            templates: reflector::store().0,
            budgets: reflector::store().0,
        };
        let tracked = Arc::new(Tracked::default());
        World {
            rng: SplitMix64::new(seed),
            rv: 1,
            claims,
            pods,
            cluster: Cluster::new(stores, tracked, Arc::new(AtomicU64::new(0))),
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn name(&mut self) -> String {
        format!("o{}", self.rng.below(NAMES))
    }

    /// What the watch driver does: apply to the cache, then report.
    fn claim_event(&mut self, event: Event<ResourceClaim>) {
        self.claims.apply_watcher_event(&event);
        self.cluster
            .tracked
            .claim_event(&event, &self.cluster.stores.claims);
    }

    fn pod_event(&mut self, event: Event<Pod>) {
        self.pods.apply_watcher_event(&event);
        self.cluster
            .tracked
            .pod_event(&event, &self.cluster.stores.pods);
    }

    /// A resourceVersion for an assumed write: newer than anything (the usual case), or older
    /// than what the cache holds (the watch got ahead of the write's reply).
    fn assumed_rv(&mut self) -> u64 {
        if self.rng.chance(0.7) {
            self.next_rv()
        } else {
            1 + self.rng.below(self.rv)
        }
    }

    fn step(&mut self) -> &'static str {
        let name = self.name();
        match self.rng.below(17) {
            0..=3 => {
                let rv = self.next_rv();
                let claim = random_claim(&mut self.rng, &name, rv);
                self.claim_event(Event::Apply(claim));
                "claim applied"
            }
            4 => {
                let rv = self.next_rv();
                let claim = random_claim(&mut self.rng, &name, rv);
                self.claim_event(Event::Delete(claim));
                "claim deleted"
            }
            5 | 6 => {
                let rv = self.assumed_rv();
                let claim = random_claim(&mut self.rng, &name, rv);
                self.cluster.assume_claim(claim);
                "claim assumed"
            }
            7 => {
                self.relist_claims();
                "claims relisted"
            }
            8..=11 => {
                let rv = self.next_rv();
                let pod = random_pod(&mut self.rng, &name, rv);
                self.pod_event(Event::Apply(pod));
                "pod applied"
            }
            12 => {
                let rv = self.next_rv();
                let pod = random_pod(&mut self.rng, &name, rv);
                self.pod_event(Event::Delete(pod));
                "pod deleted"
            }
            13 | 14 => {
                let rv = self.assumed_rv();
                let pod = random_pod(&mut self.rng, &name, rv);
                self.cluster.assume_pod(pod);
                "pod assumed"
            }
            15 => {
                self.relist_pods();
                "pods relisted"
            }
            _ => {
                self.cluster.forget_assumed();
                "assumed objects forgotten"
            }
        }
    }

    /// A relist: some objects kept, some changed, some new, the rest gone without an event.
    fn relist_claims(&mut self) {
        self.claim_event(Event::Init);
        for i in 0..NAMES {
            let name = format!("o{i}");
            let cached = self.cluster.stores.claims.state();
            let old = cached
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
            let claim = match (old, self.rng.below(3)) {
                (Some(old), 0) => (**old).clone(),
                (_, 1) => continue,
                _ => {
                    let rv = self.next_rv();
                    random_claim(&mut self.rng, &name, rv)
                }
            };
            self.claim_event(Event::InitApply(claim));
        }
        self.claim_event(Event::InitDone);
    }

    fn relist_pods(&mut self) {
        self.pod_event(Event::Init);
        for i in 0..NAMES {
            let name = format!("o{i}");
            let cached = self.cluster.stores.pods.state();
            let old = cached
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name.as_str()));
            let pod = match (old, self.rng.below(3)) {
                (Some(old), 0) => (**old).clone(),
                (_, 1) => continue,
                _ => {
                    let rv = self.next_rv();
                    random_pod(&mut self.rng, &name, rv)
                }
            };
            self.pod_event(Event::InitApply(pod));
        }
        self.pod_event(Event::InitDone);
    }

    /// The tracked state against a rebuild from the caches and the assumed objects.
    fn check(&mut self, seed: u64, step: usize, what: &str) {
        let at = format!("seed {seed}, step {step} ({what})");
        let cluster = &self.cluster;
        let claims = cluster
            .tracked
            .claims
            .overlay(cluster.stores.claims.state());
        let (expected, _) = devices_in_use(claims.iter().map(|c| &**c));
        assert_eq!(*cluster.devices_in_use(), expected, "devices in use, {at}");
        let pods = cluster.tracked.pods.overlay(cluster.stores.pods.state());
        let except = format!("uid-{}", self.name());
        for except in ["", except.as_str()] {
            let expected = node_usage(pods.iter().map(|p| &**p), except);
            assert_eq!(
                *self.cluster.node_usage(except),
                expected,
                "node usage except {except:?}, {at}"
            );
        }
    }
}

#[test]
fn tracked_usage_equals_a_rebuild_after_every_change() {
    let mut kinds = BTreeMap::<&str, usize>::new();
    let mut allocated = 0;
    for seed in 1..=8 {
        let mut world = World::new(seed);
        for step in 0..400 {
            let what = world.step();
            *kinds.entry(what).or_default() += 1;
            world.check(seed, step, what);
            allocated += world.cluster.devices_in_use().dedicated_count();
        }
    }
    // The sequences did exercise every kind of change, with devices in use.
    assert_eq!(kinds.len(), 9, "{kinds:?}");
    assert!(allocated > 0);
}
