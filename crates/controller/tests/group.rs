//! Group (gang) decisions on data: all or nothing, one fabric clique / rack first, the budget,
//! and the starvation policy — no API server involved.

use tessera_controller_harness as support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodSchedulingGroup};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1beta1::{
    BasicSchedulingPolicy, GangSchedulingPolicy, PodGroup, PodGroupSchedulingPolicy, PodGroupSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::*;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, RACK_LABEL};
use tessera_gpu_inventory::render::ServerVersion;
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};
use tessera_placement::group::{
    GroupError, GroupInput, GroupKey, GroupOutcome, GroupPlan, GroupSettings, GroupSource,
    Hierarchy, Member, Waiting, decide_group, fits_when_free, group_key, held_back_by,
    label_min_count, pod_group_min_count,
};
use tessera_placement::nodes::NodeFacts;
use tessera_placement::planner::Action;
use tessera_placement::reason::PodReason;
use tessera_placement::resolve::{PodClaim, Resolution, resolve_claims};
use tessera_placement::view::{ClusterSnapshot, PodContext, Settings};

/// The slices of a GB200 compute tray (4 GPUs, one NVLink island) in fabric clique `clique`.
fn gb200_slices(node: &str, clique: u32) -> Vec<ResourceSlice> {
    let mut inventory = MockSource::new("gb200-tray")
        .and_then(|s| s.inventory())
        .expect("the shipped gb200-tray topology loads");
    for gpu in &mut inventory.gpus {
        if let Some(f) = gpu.fabric.as_mut() {
            f.clique_id = clique;
        }
    }
    let mut options = RenderOptions::new(node);
    options.server_version = ServerVersion::V1_35;
    options.topology_managed = true;
    render_slices(&inventory, &options).expect("gb200-tray renders")
}

fn labelled(mut node: Node, labels: &[(&str, &str)]) -> Node {
    let map = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in labels {
        map.insert((*k).to_owned(), (*v).to_owned());
    }
    node
}

#[derive(Default)]
struct World {
    slices: Vec<ResourceSlice>,
    nodes: Vec<Node>,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
}

impl World {
    /// DGX H100 nodes (8 GPUs) with their rack label.
    fn racks(nodes: &[(&str, &str)]) -> World {
        let mut world = World::default();
        for (name, rack) in nodes {
            world.slices.extend(dgx_slices(name, true));
            world
                .nodes
                .push(labelled(node(name, true), &[(RACK_LABEL, rack)]));
        }
        world
    }

    /// A label-named group of `size` pods, each with one claim for `gpus` GPUs.
    fn group(&mut self, name: &str, size: usize, min_count: u32, gpus: i64) {
        for i in 0..size {
            let pod_name = format!("{name}-{i}");
            let claim_name = format!("{pod_name}-gpus");
            let mut pod = gated_pod(&pod_name, &[("gpus", Source::Claim(&claim_name))]);
            pod.metadata.labels = Some(BTreeMap::from([(GROUP_LABEL.into(), name.into())]));
            pod.metadata.annotations = Some(BTreeMap::from([(
                GROUP_MIN_COUNT_ANNOTATION.into(),
                min_count.to_string(),
            )]));
            self.pods.push(pod);
            self.claims.push(gpu_claim(&claim_name, gpus));
        }
    }

    fn view(&self) -> ClusterSnapshot {
        ClusterSnapshot::new(
            self.slices.clone(),
            shipped_classes(),
            self.nodes.iter().map(NodeFacts::from).collect(),
        )
    }

    fn members(&self, group: &str) -> Vec<(Pod, Vec<PodClaim>)> {
        let by_name: HashMap<String, Arc<ResourceClaim>> = self
            .claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), Arc::new(c.clone())))
            .collect();
        self.pods
            .iter()
            .filter(|p| group_key(p).is_some_and(|k| k.name == group))
            .map(|p| {
                let Resolution::Resolved(claims) =
                    resolve_claims(p, |n| by_name.get(n).cloned(), |_| true)
                else {
                    panic!("the test pod's claims resolve");
                };
                (p.clone(), claims)
            })
            .collect()
    }

    fn decide(&self, group: &str, settings: &GroupSettings) -> GroupPlan {
        self.decide_in(&self.view(), group, settings)
    }

    fn decide_in(
        &self,
        view: &ClusterSnapshot,
        group: &str,
        settings: &GroupSettings,
    ) -> GroupPlan {
        let members = self.members(group);
        let key = group_key(&members[0].0).unwrap();
        let min_count = label_min_count(&key, members.iter().map(|(p, _)| p)).unwrap();
        let input = GroupInput {
            key: &key,
            min_count,
            placed: 0,
            members: members
                .iter()
                .map(|(pod, claims)| Member { pod, claims })
                .collect(),
            unresolved: 0,
            held: 0,
            domain_nodes: Default::default(),
        };
        let in_use = AllocatedState::from_claims(&self.claims).unwrap();
        let usage = HashMap::new();
        let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
        let unmanaged_fn = || unmanaged.clone();
        let context = PodContext {
            devices: view,
            unmanaged: &unmanaged_fn,
            in_use: &in_use,
            usage: &usage,
        };
        decide_group(
            &input,
            &context,
            &Settings::new(tessera_api::names::TOPOLOGY_AWARE_GATE),
            settings,
            Timestamp::now(),
        )
    }

    /// Writes a placed group's allocations into the claims (as the controller would).
    fn apply(&mut self, decision: &GroupPlan) {
        let GroupOutcome::Place { plans, .. } = &decision.outcome else {
            panic!("expected a placement, got {:?}", decision.outcome);
        };
        for (_, d) in plans {
            let Action::Place(p) = &d.action else {
                panic!("expected pod placements");
            };
            for w in &p.writes {
                let claim = self
                    .claims
                    .iter_mut()
                    .find(|c| c.metadata.name == w.claim.metadata.name)
                    .unwrap();
                claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
                    allocation: Some(w.allocation.clone()),
                    ..Default::default()
                });
            }
        }
    }
}

/// Pod name → node of a placed group, sorted by pod.
fn nodes_of(decision: &GroupPlan) -> Vec<(String, String)> {
    let GroupOutcome::Place { plans, .. } = &decision.outcome else {
        panic!("expected a placement, got {:?}", decision.outcome);
    };
    let mut out: Vec<(String, String)> = plans
        .iter()
        .map(|(_, d)| {
            let Action::Place(p) = &d.action else {
                panic!("expected pod placements, got {:?}", d.action);
            };
            let pod = p.writes[0].claim.metadata.name.clone().unwrap();
            (pod.trim_end_matches("-gpus").to_owned(), p.node.clone())
        })
        .collect();
    out.sort();
    out
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn a_gang_lands_in_one_rack_although_another_node_comes_first_by_name() {
    // Per-pod first fit would take dgx-a (first by name) and one node of rack r1: two racks.
    let mut world = World::racks(&[("dgx-a", "r2"), ("dgx-b", "r1"), ("dgx-c", "r1")]);
    world.group("train", 2, 2, 8);
    let decision = world.decide("train", &GroupSettings::default());
    assert_eq!(
        nodes_of(&decision),
        pairs(&[("train-0", "dgx-b"), ("train-1", "dgx-c")])
    );
    let GroupOutcome::Place { domain, score, .. } = &decision.outcome else {
        unreachable!()
    };
    assert_eq!(domain.to_string(), format!("{RACK_LABEL}=r1"));
    assert_eq!(score.domains[0], 1, "one rack");
    assert!(!decision.truncated);
}

#[test]
fn pods_of_a_gang_share_a_node_when_it_holds_them() {
    let mut world = World::racks(&[("dgx-a", "r2"), ("dgx-b", "r1"), ("dgx-c", "r1")]);
    world.group("small", 2, 2, 4);
    let decision = world.decide("small", &GroupSettings::default());
    let nodes = nodes_of(&decision);
    assert_eq!(nodes[0].1, nodes[1].1, "both 4-GPU pods on one 8-GPU node");
}

#[test]
fn one_fabric_clique_comes_first() {
    // Three GB200 trays (4 GPUs each): tray-a alone in clique 1, tray-b and tray-c in clique 2.
    let mut world = World::default();
    for (name, clique) in [("tray-a", 1), ("tray-b", 2), ("tray-c", 2)] {
        world.slices.extend(gb200_slices(name, clique));
        world.nodes.push(node(name, true));
    }
    world.group("nvl", 2, 2, 4);
    let decision = world.decide("nvl", &GroupSettings::default());
    assert_eq!(
        nodes_of(&decision),
        pairs(&[("nvl-0", "tray-b"), ("nvl-1", "tray-c")])
    );
    let GroupOutcome::Place { domain, score, .. } = &decision.outcome else {
        unreachable!()
    };
    assert_eq!(domain.level, "fabricClique");
    assert!(!score.outside_one_clique);
}

#[test]
fn a_gang_that_does_not_fit_whole_places_nothing() {
    let mut world = World::racks(&[("dgx-a", "r1"), ("dgx-b", "r1")]);
    world.group("big", 3, 3, 8);
    let decision = world.decide("big", &GroupSettings::default());
    let GroupOutcome::Wait {
        reason,
        message,
        pods,
        ..
    } = &decision.outcome
    else {
        panic!("expected the group to wait, got {:?}", decision.outcome);
    };
    assert_eq!(reason.as_str(), "GroupUnsatisfiable");
    assert!(
        message.contains("group ml/big needs 3 of its 3 gated pods placed together"),
        "{message}"
    );
    assert!(message.contains("placed 2 of them"), "{message}");
    assert!(message.contains("ml/big-2 did not fit there"), "{message}");
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(pods[2].node.is_none());
}

#[test]
fn two_gangs_that_do_not_fit_together_one_runs_the_other_waits() {
    let mut world = World::racks(&[("dgx-a", "r1"), ("dgx-b", "r1"), ("dgx-c", "r2")]);
    world.group("first", 2, 2, 8);
    world.group("second", 2, 2, 8);
    let first = world.decide("first", &GroupSettings::default());
    assert_eq!(
        nodes_of(&first),
        pairs(&[("first-0", "dgx-a"), ("first-1", "dgx-b")])
    );
    world.apply(&first);
    let second = world.decide("second", &GroupSettings::default());
    assert!(
        matches!(
            second.outcome,
            GroupOutcome::Wait {
                reason: PodReason::GroupUnsatisfiable,
                ..
            }
        ),
        "{:?}",
        second.outcome
    );
    // It would run on the cluster when free, so it may hold back later arrivals.
    let members = world.members("second");
    let key = group_key(&members[0].0).unwrap();
    let input = GroupInput {
        key: &key,
        min_count: 2,
        placed: 0,
        members: members
            .iter()
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        held: 0,
        domain_nodes: Default::default(),
    };
    let unmanaged = Arc::new(DeviceIndex::new(Vec::new(), Vec::new(), Vec::new()));
    let settings = Settings::new(tessera_api::names::TOPOLOGY_AWARE_GATE);
    assert!(fits_when_free(
        &input,
        &world.view(),
        &|| unmanaged.clone(),
        &settings,
        &GroupSettings::default(),
        Timestamp::now(),
    ));
    // Delete the first gang: its claims go, and the second fits.
    world.claims.retain(|c| {
        !c.metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .starts_with("first")
    });
    let second = world.decide("second", &GroupSettings::default());
    assert_eq!(nodes_of(&second).len(), 2);
}

#[test]
fn min_count_below_the_group_size_places_what_fits() {
    let mut world = World::racks(&[("dgx-a", "r1"), ("dgx-b", "r1")]);
    world.group("elastic", 3, 2, 8);
    let decision = world.decide("elastic", &GroupSettings::default());
    assert_eq!(
        nodes_of(&decision).len(),
        2,
        "two of three fit, and two suffice"
    );
}

#[test]
fn a_group_short_of_pods_waits_for_them() {
    let mut world = World::racks(&[("dgx-a", "r1")]);
    world.group("late", 1, 3, 1);
    let decision = world.decide("late", &GroupSettings::default());
    let GroupOutcome::Wait {
        reason, message, ..
    } = &decision.outcome
    else {
        panic!("{:?}", decision.outcome);
    };
    assert_eq!(reason.as_str(), "WaitingForGroup");
    assert!(message.contains("waiting for 2 more"), "{message}");
    assert_eq!(decision.steps, 0);
}

#[test]
fn the_budget_bounds_the_search_and_keeps_what_it_found() {
    // Best fit tries the fullest rack first: r2 (8 free) fails in two steps, r1 (16 free) holds the
    // group in two more, and r3 would be tried next for a better score.
    let mut world = World::racks(&[
        ("dgx-a", "r2"),
        ("dgx-b", "r1"),
        ("dgx-c", "r1"),
        ("dgx-d", "r3"),
        ("dgx-e", "r3"),
    ]);
    world.group("train", 2, 2, 8);
    let tight = GroupSettings {
        budget: 3,
        ..GroupSettings::default()
    };
    let decision = world.decide("train", &tight);
    assert!(decision.truncated);
    assert_eq!(decision.steps, 3);
    assert!(
        matches!(&decision.outcome, GroupOutcome::Wait { message, .. } if message.contains("stopped at its budget")),
        "{:?}",
        decision.outcome
    );
    let enough = GroupSettings {
        budget: 4,
        ..GroupSettings::default()
    };
    let decision = world.decide("train", &enough);
    assert_eq!(decision.steps, 4);
    assert!(decision.truncated, "stopped before trying rack r3");
    assert_eq!(
        nodes_of(&decision),
        pairs(&[("train-0", "dgx-b"), ("train-1", "dgx-c")]),
        "the group it found is kept"
    );
    let unbounded = world.decide("train", &GroupSettings::default());
    assert!(!unbounded.truncated);
    assert_eq!(
        unbounded.steps, 6,
        "all three racks tried, then the best kept"
    );
}

#[test]
fn explain_accounts_decide_each_pod_alone() {
    let mut world = World::racks(&[("dgx-a", "r1")]);
    world.group("pair", 2, 2, 8);
    let settings = GroupSettings {
        accounts: true,
        ..GroupSettings::default()
    };
    let decision = world.decide("pair", &settings);
    let GroupOutcome::Wait { pods, .. } = &decision.outcome else {
        panic!("{:?}", decision.outcome);
    };
    assert_eq!(pods.len(), 2);
    assert!(
        pods.iter().all(|p| p.node.as_deref() == Some("dgx-a")),
        "{pods:?}"
    );
    assert!(pods.iter().all(|p| p.message == "fits alone"));
}

#[test]
fn group_names_from_the_pod_group_field_or_the_label() {
    let mut pod = gated_pod("p", &[]);
    assert_eq!(group_key(&pod), None);
    pod.metadata.labels = Some(BTreeMap::from([(GROUP_LABEL.into(), "by-label".into())]));
    assert_eq!(
        group_key(&pod),
        Some(GroupKey {
            namespace: NS.into(),
            name: "by-label".into(),
            source: GroupSource::Label
        })
    );
    pod.spec.as_mut().unwrap().scheduling_group = Some(PodSchedulingGroup {
        pod_group_name: Some("upstream".into()),
    });
    let key = group_key(&pod).unwrap();
    assert_eq!(key.source, GroupSource::PodGroup);
    assert_eq!(key.to_string(), "PodGroup ml/upstream");
}

#[test]
fn min_count_errors_name_the_pod_the_annotation_and_the_fix() {
    let key = GroupKey {
        namespace: NS.into(),
        name: "g".into(),
        source: GroupSource::Label,
    };
    let with = |name: &str, value: Option<&str>| {
        let mut pod = gated_pod(name, &[]);
        pod.metadata.annotations =
            value.map(|v| BTreeMap::from([(GROUP_MIN_COUNT_ANNOTATION.to_owned(), v.to_owned())]));
        pod
    };
    assert_eq!(
        label_min_count(&key, &[with("a", Some("4")), with("b", None)]),
        Ok(4)
    );
    let err = label_min_count(&key, &[with("a", Some("zero"))]).unwrap_err();
    assert!(matches!(err, GroupError::BadMinCount { .. }));
    assert!(err.to_string().contains("pod ml/a"), "{err}");
    assert!(
        err.to_string().contains(GROUP_MIN_COUNT_ANNOTATION),
        "{err}"
    );
    let err = label_min_count(&key, &[with("a", Some("0"))]).unwrap_err();
    assert!(matches!(err, GroupError::BadMinCount { .. }));
    let err = label_min_count(&key, &[with("a", Some("2")), with("b", Some("3"))]).unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
    let err = label_min_count(&key, &[with("a", None)]).unwrap_err();
    assert!(matches!(err, GroupError::MissingMinCount { .. }), "{err}");
}

#[test]
fn pod_group_min_count_reads_the_gang_policy() {
    let group = |policy: PodGroupSchedulingPolicy| PodGroup {
        metadata: ObjectMeta {
            name: Some("pg".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: PodGroupSpec {
            scheduling_policy: policy,
            ..Default::default()
        },
        status: None,
    };
    let gang = |n| PodGroupSchedulingPolicy {
        gang: Some(GangSchedulingPolicy { min_count: n }),
        basic: None,
    };
    assert_eq!(pod_group_min_count(&group(gang(8))), Ok(Some(8)));
    let basic = PodGroupSchedulingPolicy {
        basic: Some(BasicSchedulingPolicy::default()),
        gang: None,
    };
    assert_eq!(pod_group_min_count(&group(basic)), Ok(None));
    let err = pod_group_min_count(&group(gang(0))).unwrap_err();
    assert!(err.to_string().contains("PodGroup ml/pg"), "{err}");
    assert!(err.to_string().contains("gang.minCount"), "{err}");
}

#[test]
fn hierarchy_parses_label_keys_finest_first() {
    assert_eq!(
        Hierarchy::parse(" a/rack , b/block").unwrap().labels,
        ["a/rack", "b/block"]
    );
    assert!(Hierarchy::parse("").unwrap().labels.is_empty());
    let err = Hierarchy::parse("a,,b").unwrap_err();
    assert!(err.to_string().contains("entry 1 is empty"), "{err}");
}

#[test]
fn an_old_waiting_group_holds_back_later_arrivals_only() {
    let t0 = Timestamp::from_second(1_000_000).unwrap();
    let key = |name: &str| GroupKey {
        namespace: NS.into(),
        name: name.into(),
        source: GroupSource::Label,
    };
    let waiting = vec![
        Waiting {
            key: key("old"),
            priority: 0,
            arrived: t0,
            since: t0,
            fits_when_free: true,
        },
        Waiting {
            key: key("never"),
            priority: 0,
            arrived: t0 - SignedDuration::from_secs(10),
            since: t0,
            fits_when_free: false,
        },
    ];
    let hold = SignedDuration::from_secs(60);
    let later = t0 + SignedDuration::from_secs(5);
    // Within the hold time nobody is held back.
    assert_eq!(
        held_back_by(
            0,
            later,
            None,
            &waiting,
            t0 + SignedDuration::from_secs(30),
            hold
        ),
        None
    );
    let now = t0 + SignedDuration::from_secs(61);
    let by = held_back_by(0, later, None, &waiting, now, hold).expect("held back");
    assert_eq!(
        by.key.name, "old",
        "a group that could never run holds back nothing"
    );
    // Earlier arrivals and the group itself are not held back.
    let earlier = t0 - SignedDuration::from_secs(1);
    assert_eq!(held_back_by(0, earlier, None, &waiting, now, hold), None);
    assert_eq!(
        held_back_by(0, later, Some(&key("old")), &waiting, now, hold),
        None
    );
    // Priority first: a later arrival of higher priority is never held back, an earlier one of
    // lower priority is.
    assert_eq!(held_back_by(1, later, None, &waiting, now, hold), None);
    let by = held_back_by(-1, earlier, None, &waiting, now, hold).expect("held back");
    assert_eq!(by.key.name, "old");
}
