//! IMEX domains over random traces: domain gangs of 1–4 trays arrive on two cliques of four
//! GB200 trays with two channels each (so channels run out before trays do), wait, are placed by
//! the controller's group decision, lose pods one at a time and finish. After every step:
//!
//! - no claim is written twice, and no device (GPU or channel) is held by two claims;
//! - every placed domain has exactly one channel, and every pod of it runs in that channel's
//!   clique;
//! - no channel is held by two live domains of a clique;
//! - no node hosts pods of two live domains (one IMEX daemon per node);
//! - a domain's channel stays held while one of its pods lives and is free once the last is gone
//!   (the claim is deallocated then, as the resourceclaim controller does).

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSpec};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::imex::{IMEX_DEVICE_CLASS, clique_of_pool};
use tessera_api::names::{GPU_DEVICE_CLASS, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION};
use tessera_placement::group::{
    GroupInput, GroupKey, GroupOutcome, GroupSettings, GroupSource, Member, decide_group,
};
use tessera_placement::imex::DomainNodes;
use tessera_placement::nodes::NodeFacts;
use tessera_placement::planner::Action;
use tessera_placement::pods::devices_in_use;
use tessera_placement::resolve::PodClaim;
use tessera_placement::synthetic::device_claim;
use tessera_placement::view::{ClusterSnapshot, PodContext, Settings};

use support::imex::gb200_cluster;

const NS: &str = "sim";

#[derive(Clone, Debug)]
enum Op {
    /// A domain gang of `trays` pods of `gpus` GPUs each.
    Arrive { trays: usize, gpus: i64 },
    /// One pod of the `n`th live gang finishes.
    PodDone(usize),
    /// The `n`th live gang finishes whole.
    Finish(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..=4, prop_oneof![Just(4i64), Just(2i64)])
            .prop_map(|(trays, gpus)| Op::Arrive { trays, gpus }),
        1 => (0usize..8).prop_map(Op::PodDone),
        2 => (0usize..8).prop_map(Op::Finish),
    ]
}

struct Gang {
    name: String,
    /// Pods still alive (placed or waiting), with their GPU claim.
    pods: Vec<(Pod, String)>,
    /// Node of each placed pod, by pod name.
    nodes: BTreeMap<String, String>,
}

struct Trace {
    snapshot: ClusterSnapshot,
    /// Every claim, by name.
    claims: BTreeMap<String, Arc<ResourceClaim>>,
    waiting: Vec<Gang>,
    live: Vec<Gang>,
    arrivals: usize,
}

fn pod(gang: &str, i: usize, min: usize, gpus: &str) -> Pod {
    let claim = |name: &str, claim: &str| PodResourceClaim {
        name: name.into(),
        resource_claim_name: Some(claim.into()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("{gang}-{i}")),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{gang}-{i}")),
            labels: Some([(GROUP_LABEL.to_owned(), gang.to_owned())].into()),
            annotations: Some([(GROUP_MIN_COUNT_ANNOTATION.to_owned(), min.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            resource_claims: Some(vec![
                claim("gpus", gpus),
                claim("domain", &format!("{gang}-domain")),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

impl Trace {
    fn new() -> Trace {
        let objects = gb200_cluster(&[(1, 4), (2, 4)], 2);
        let facts = objects.nodes.iter().map(NodeFacts::from).collect();
        Trace {
            snapshot: ClusterSnapshot::new(objects.slices, objects.classes, facts),
            claims: BTreeMap::new(),
            waiting: Vec::new(),
            live: Vec::new(),
            arrivals: 0,
        }
    }

    fn add_claim(&mut self, name: &str, class: &str, count: i64) {
        let claim = device_claim(NS, name, &format!("uid-{name}"), class, count);
        self.claims.insert(name.to_owned(), Arc::new(claim));
    }

    fn arrive(&mut self, trays: usize, gpus: i64) {
        let name = format!("g{}", self.arrivals);
        self.arrivals += 1;
        self.add_claim(&format!("{name}-domain"), IMEX_DEVICE_CLASS, 1);
        let mut pods = Vec::new();
        for i in 0..trays {
            let claim = format!("{name}-{i}-gpus");
            self.add_claim(&claim, GPU_DEVICE_CLASS, gpus);
            pods.push((pod(&name, i, trays, &claim), claim));
        }
        self.waiting.push(Gang {
            name,
            pods,
            nodes: BTreeMap::new(),
        });
    }

    fn in_use(&self) -> AllocatedState {
        devices_in_use(self.claims.values().map(|c| &**c)).0
    }

    fn pod_claims(&self, gang: &Gang, gpus: &str) -> Vec<PodClaim> {
        [
            ("gpus", gpus.to_owned()),
            ("domain", format!("{}-domain", gang.name)),
        ]
        .into_iter()
        .map(|(pod_claim, name)| PodClaim {
            pod_claim: pod_claim.into(),
            claim: self.claims[&name].clone(),
        })
        .collect()
    }

    /// Decides each waiting gang in arrival order; returns the writes' failures.
    fn place_waiting(&mut self) -> Result<(), TestCaseError> {
        let waiting = std::mem::take(&mut self.waiting);
        for mut gang in waiting {
            match self.decide(&gang)? {
                Some(nodes) => {
                    gang.nodes = nodes;
                    self.live.push(gang);
                }
                None => self.waiting.push(gang),
            }
        }
        Ok(())
    }

    /// The live domains on each node, read from the placed pods bound to their nodes.
    fn domain_nodes(&self) -> DomainNodes {
        let mut bound = Vec::new();
        for gang in &self.live {
            for (pod, _) in &gang.pods {
                let name = pod.metadata.name.as_deref().unwrap();
                if let Some(node) = gang.nodes.get(name) {
                    let mut pod = pod.clone();
                    pod.spec.as_mut().unwrap().node_name = Some(node.clone());
                    bound.push(pod);
                }
            }
        }
        DomainNodes::of(&bound, |_, name| self.claims.get(name).cloned())
    }

    /// The gang's group decision; when placed, its writes applied and each pod's node.
    fn decide(&mut self, gang: &Gang) -> Result<Option<BTreeMap<String, String>>, TestCaseError> {
        let claims: Vec<Vec<PodClaim>> = gang
            .pods
            .iter()
            .map(|(_, gpus)| self.pod_claims(gang, gpus))
            .collect();
        let key = GroupKey {
            namespace: NS.into(),
            name: gang.name.clone(),
            source: GroupSource::Label,
        };
        let input = GroupInput {
            key: &key,
            min_count: u32::try_from(gang.pods.len()).unwrap(),
            placed: 0,
            members: gang
                .pods
                .iter()
                .zip(&claims)
                .map(|((pod, _), claims)| Member { pod, claims })
                .collect(),
            unresolved: 0,
            held: 0,
            domain_nodes: self.domain_nodes(),
        };
        let in_use = self.in_use();
        let usage = HashMap::new();
        let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
        let unmanaged_fn = || unmanaged.clone();
        let context = PodContext {
            devices: &self.snapshot,
            unmanaged: &unmanaged_fn,
            in_use: &in_use,
            usage: &usage,
        };
        let settings = Settings::new(tessera_api::names::TOPOLOGY_AWARE_GATE);
        let plan = decide_group(
            &input,
            &context,
            &settings,
            &GroupSettings::default(),
            Timestamp::UNIX_EPOCH,
        );
        let GroupOutcome::Place { plans, .. } = plan.outcome else {
            return Ok(None);
        };
        let mut nodes = BTreeMap::new();
        let mut written = BTreeSet::new();
        for (index, member) in plans {
            let Action::Place(placement) = member.action else {
                return Err(TestCaseError::fail(format!("{member:?}")));
            };
            for write in placement.writes {
                let name = write.claim.metadata.name.clone().unwrap();
                prop_assert!(written.insert(name.clone()), "claim {name} written twice");
                let claim = Arc::make_mut(self.claims.get_mut(&name).unwrap());
                prop_assert!(claim.status.is_none(), "claim {name} allocated again");
                claim.status.get_or_insert_with(Default::default).allocation =
                    Some(write.allocation);
            }
            let pod = gang.pods[index].0.metadata.name.clone().unwrap();
            nodes.insert(pod, placement.node);
        }
        Ok(Some(nodes))
    }

    /// A pod of the `n`th live gang is gone: its GPUs are released, and the domain's channel with
    /// the last pod.
    fn pod_done(&mut self, n: usize, whole: bool) {
        if self.live.is_empty() {
            return;
        }
        let i = n % self.live.len();
        let gang = &mut self.live[i];
        let gone = if whole { gang.pods.len() } else { 1 };
        for (pod, gpus) in gang.pods.drain(..gone) {
            gang.nodes.remove(pod.metadata.name.as_deref().unwrap());
            self.claims.remove(&gpus);
        }
        if gang.pods.is_empty() {
            let gang = self.live.remove(i);
            self.claims.remove(&format!("{}-domain", gang.name));
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        // No device held by two claims.
        let mut holders: BTreeMap<String, String> = BTreeMap::new();
        for (name, claim) in &self.claims {
            let results = claim
                .status
                .iter()
                .flat_map(|s| s.allocation.iter())
                .flat_map(|a| a.devices.iter())
                .flat_map(|d| d.results.iter().flatten());
            for r in results {
                let device = format!("{}/{}", r.pool, r.device);
                if let Some(other) = holders.insert(device.clone(), name.clone()) {
                    prop_assert!(false, "{device} held by {other} and {name}");
                }
            }
        }
        for gang in &self.live {
            let domain = &self.claims[&format!("{}-domain", gang.name)];
            let results: Vec<_> = domain
                .status
                .iter()
                .flat_map(|s| s.allocation.iter())
                .flat_map(|a| a.devices.iter())
                .flat_map(|d| d.results.iter().flatten())
                .collect();
            prop_assert_eq!(results.len(), 1, "gang {} has one channel", &gang.name);
            let clique = clique_of_pool(&results[0].pool).unwrap();
            for node in gang.nodes.values() {
                let tray_clique = node.split('-').nth(1).unwrap();
                prop_assert!(
                    clique.ends_with(&format!(".{tray_clique}")),
                    "gang {} runs on {node}, its channel is in clique {clique}",
                    &gang.name
                );
            }
        }
        // One live domain per node.
        let mut on_node: BTreeMap<&str, &str> = BTreeMap::new();
        for gang in &self.live {
            for node in gang.nodes.values() {
                if let Some(other) = on_node.insert(node, &gang.name) {
                    prop_assert!(
                        other == gang.name,
                        "{node} hosts pods of the domains {other} and {}",
                        &gang.name
                    );
                }
            }
        }
        // Waiting gangs hold nothing; channels of finished domains are free.
        for gang in &self.waiting {
            let domain = &self.claims[&format!("{}-domain", gang.name)];
            prop_assert!(
                domain.status.is_none(),
                "waiting gang {} holds a channel",
                &gang.name
            );
        }
        let channels = holders.keys().filter(|d| d.contains("/channel-")).count();
        prop_assert_eq!(channels, self.live.len(), "one channel per live domain");
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn domains_keep_to_one_clique_and_one_channel_released_after_the_last_pod(
        ops in prop::collection::vec(op(), 1..24)
    ) {
        let mut trace = Trace::new();
        for op in ops {
            match op {
                Op::Arrive { trays, gpus } => trace.arrive(trays, gpus),
                Op::PodDone(n) => trace.pod_done(n, false),
                Op::Finish(n) => trace.pod_done(n, true),
            }
            trace.place_waiting()?;
            trace.check()?;
        }
        // Drained: everything finishes, and every waiting gang that fits alone then runs.
        while !trace.live.is_empty() {
            trace.pod_done(0, true);
            trace.place_waiting()?;
            trace.check()?;
        }
        prop_assert!(trace.waiting.is_empty(), "{} gangs never ran", trace.waiting.len());
    }
}
