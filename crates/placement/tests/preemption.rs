//! Preemption for devices, decided on a small cluster of dgx-h100 nodes and carried out by the
//! controller model: who is chosen, who never is, what the plan says, and that the nominated
//! devices go to the preemptor.

mod support;

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_placement::group::{GroupInput, GroupKey, GroupSettings, GroupSource, Member};
use tessera_placement::planner::Action;
use tessera_placement::preemption::nomination::{Nomination, Nominations, with_reserved};
use tessera_placement::preemption::{
    DisruptionBudgets, ManagedDevices, PreemptionDecision, PreemptionInput, PreemptionOutcome,
    PreemptionSettings, Victims, pod_priority, preempt_group, preempt_pod,
};
use tessera_placement::simulation::{BudgetTemplate, ClusterModel, PodTemplate};
use tessera_placement::view::{PodContext, Settings, decide_pod};

use support::{cluster, controller, finish_terminating, node_of, plans, step};

/// The devices a pod's claim holds, by name.
fn devices_of(model: &ClusterModel, uid: &str) -> Vec<String> {
    let pod = model.pod(uid).unwrap();
    let mut names: Vec<String> = model
        .claims_of(pod)
        .iter()
        .filter_map(|c| c.claim.status.as_ref()?.allocation.as_ref())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| r.device.clone())
        .collect();
    names.sort();
    names
}

fn batch(name: &str, priority: i32, gpus: u32) -> PodTemplate {
    let mut t = PodTemplate::new(name, priority, gpus);
    t.labels.insert("tier".into(), "batch".into());
    t
}

/// One node filled by four 2-GPU batch pods of priority 0, placed a minute apart.
fn full_node() -> (
    ClusterModel,
    tessera_placement::simulation::ControllerModel,
    Vec<String>,
) {
    let mut model = cluster(1, 1);
    let mut ctl = controller(true);
    let mut uids = Vec::new();
    for i in 0..4 {
        uids.push(model.create(&batch(&format!("b{i}"), 0, 2)));
        step(&mut ctl, &mut model, 60);
    }
    for uid in &uids {
        assert!(node_of(&model, uid).is_some(), "{uid} runs");
    }
    (model, ctl, uids)
}

#[test]
fn a_higher_priority_pod_preempts_the_fewest_lowest_priority_pods_and_gets_their_devices() {
    let (mut model, mut ctl, batch) = full_node();
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    step(&mut ctl, &mut model, 5);
    let plans = plans(&ctl);
    assert_eq!(plans.len(), 1);
    let plan = plans[0];
    // Two of the 2-GPU pods make room; the ones that ran least lose least (b2 and b3, placed
    // last, on gpu-4..7: NUMA node 1).
    let victims: Vec<&str> = plan.victims.iter().map(|v| v.pod.as_str()).collect();
    assert_eq!(victims, ["sim/b2", "sim/b3"]);
    assert_eq!(plan.cost.victims, 2);
    assert!(
        plan.message
            .starts_with("would preempt sim/b2, sim/b3 (priority 0) to free gpu-4..7 of dgx-000"),
        "{}",
        plan.message
    );
    // Nominated, victims terminating, nothing allocated twice meanwhile.
    let nomination = Nomination::of(model.pod(&prod).unwrap()).expect("nominated");
    assert_eq!(nomination.node, "dgx-000");
    assert_eq!(nomination.victims.len(), 2);
    for uid in &batch[2..] {
        assert!(
            model
                .pod(uid)
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
        );
    }
    step(&mut ctl, &mut model, 5);
    assert!(node_of(&model, &prod).is_none(), "waits for its victims");
    finish_terminating(&mut model);
    step(&mut ctl, &mut model, 5);
    assert_eq!(node_of(&model, &prod).as_deref(), Some("dgx-000"));
    assert_eq!(
        devices_of(&model, &prod),
        ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    );
    assert!(
        Nomination::of(model.pod(&prod).unwrap()).is_none(),
        "placing the pod releases its nomination"
    );
}

#[test]
fn equal_priority_and_preemption_policy_never_preempt_nobody() {
    let (mut model, mut ctl, _) = full_node();
    model.create(&PodTemplate::new("peer", 0, 4));
    let mut never = PodTemplate::new("polite", 1000, 4);
    never.never_preempts = true;
    model.create(&never);
    step(&mut ctl, &mut model, 5);
    assert!(plans(&ctl).is_empty());
}

#[test]
fn the_lowest_priorities_are_preempted_first_then_the_least_work() {
    let mut model = cluster(1, 1);
    let mut ctl = controller(true);
    let high = model.create(&batch("high", 500, 2));
    step(&mut ctl, &mut model, 600);
    let old = model.create(&batch("old", 0, 2));
    step(&mut ctl, &mut model, 600);
    let mid = model.create(&batch("mid", 100, 2));
    step(&mut ctl, &mut model, 600);
    let young = model.create(&batch("young", 0, 2));
    step(&mut ctl, &mut model, 600);
    model.create(&PodTemplate::new("prod", 1000, 2));
    step(&mut ctl, &mut model, 5);
    let plans = plans(&ctl);
    let victims: Vec<&str> = plans[0].victims.iter().map(|v| v.uid.as_str()).collect();
    assert_eq!(victims, [young.as_str()], "priority 0, ran least");
    for kept in [&high, &old, &mid] {
        assert!(
            model
                .pod(kept)
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_none()
        );
    }
}

#[test]
fn one_large_victim_beats_several_small_ones() {
    let mut model = cluster(1, 1);
    let mut ctl = controller(true);
    let big = model.create(&batch("big", 0, 4));
    step(&mut ctl, &mut model, 5);
    for i in 0..4 {
        model.create(&batch(&format!("small{i}"), 0, 1));
    }
    step(&mut ctl, &mut model, 5);
    model.create(&PodTemplate::new("prod", 1000, 4));
    step(&mut ctl, &mut model, 5);
    let victims: Vec<&str> = plans(&ctl)[0]
        .victims
        .iter()
        .map(|v| v.uid.as_str())
        .collect();
    assert_eq!(victims, [big.as_str()]);
}

#[test]
fn a_budget_that_allows_no_disruption_blocks_its_pods_and_the_message_names_it() {
    let (mut model, _, _) = full_node();
    model.add_budget(BudgetTemplate {
        name: "keep-batch".into(),
        labels: BTreeMap::from([("tier".to_owned(), "batch".to_owned())]),
        min_available: 4,
    });
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    let decision = search(&model, &prod);
    match decision {
        PreemptionOutcome::NotPossible { message, .. } => assert!(
            message.contains(
                "4 are protected by PodDisruptionBudget sim/keep-batch (0 disruption(s) allowed)"
            ),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_budget_is_counted_across_the_victims_of_one_plan() {
    let (mut model, _, _) = full_node();
    // Three of the four may go, one at a time: a plan needing two is fine, one needing four is not.
    model.add_budget(BudgetTemplate {
        name: "some-batch".into(),
        labels: BTreeMap::from([("tier".to_owned(), "batch".to_owned())]),
        min_available: 3,
    });
    let four = model.create(&PodTemplate::new("four", 1000, 4));
    assert!(
        matches!(search(&model, &four), PreemptionOutcome::NotPossible { .. }),
        "two victims needed, one allowed"
    );
    let two = model.create(&PodTemplate::new("two", 1000, 2));
    let PreemptionOutcome::Preempt(plan) = search(&model, &two) else {
        panic!("one victim is enough and allowed");
    };
    assert_eq!(plan.victims.len(), 1);
}

/// The search for pod `uid` on the model as it is (no nominations).
fn search(model: &ClusterModel, uid: &str) -> PreemptionOutcome {
    search_with(
        model,
        uid,
        model.pods().cloned().collect(),
        model.claims().cloned().collect(),
    )
}

/// The search for pod `uid` with the running pods and claims given.
fn search_with(
    model: &ClusterModel,
    uid: &str,
    pods: Vec<Pod>,
    claims: Vec<std::sync::Arc<k8s_openapi::api::resource::v1::ResourceClaim>>,
) -> PreemptionOutcome {
    let pod: Pod = model.pod(uid).unwrap().clone();
    let victims = Victims::new(
        &ManagedDevices::new(&model.snapshot),
        &pods,
        claims,
        DisruptionBudgets::new(model.budgets()),
        &HashSet::new(),
        model.now,
    );
    let claims = model.claims_of(&pod);
    let in_use = model.in_use();
    let usage = model.usage();
    let unmanaged = std::sync::Arc::new(tessera_allocator::DeviceIndex::new(
        Vec::new(),
        Vec::new(),
        Vec::new(),
    ));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &in_use,
        usage: &usage,
    };
    let settings = PreemptionSettings::default();
    let input = PreemptionInput {
        victims: &victims,
        reserved: &[],
        refused: &HashSet::new(),
        settings: &settings,
    };
    preempt_pod(
        &pod,
        &claims,
        &context,
        &Settings::new(TOPOLOGY_AWARE_GATE),
        &input,
        model.now,
    )
    .outcome
}

#[test]
fn a_gang_is_evicted_whole_or_not_at_all() {
    let mut model = cluster(2, 2);
    let mut ctl = controller(true);
    let mut gang = Vec::new();
    for i in 0..2 {
        let mut t = batch(&format!("g{i}"), 0, 8);
        t.group = Some(("low-gang".into(), 2));
        gang.push(model.create(&t));
    }
    step(&mut ctl, &mut model, 5);
    assert!(gang.iter().all(|g| node_of(&model, g).is_some()));
    model.create(&PodTemplate::new("prod", 1000, 4));
    step(&mut ctl, &mut model, 5);
    let victims: Vec<&str> = plans(&ctl)[0]
        .victims
        .iter()
        .map(|v| v.uid.as_str())
        .collect();
    assert_eq!(
        victims.len(),
        2,
        "the whole gang, though 4 GPUs of one pod would do"
    );
    for g in &gang {
        assert!(model.pod(g).unwrap().metadata.deletion_timestamp.is_some());
    }
}

#[test]
fn a_gang_preempts_for_all_its_pods_and_gives_back_the_victims_it_does_not_need() {
    let mut model = cluster(3, 3);
    let mut ctl = controller(true);
    let mut scavengers = Vec::new();
    for i in 0..24 {
        scavengers.push(model.create(&batch(&format!("s{i:02}"), -10, 1)));
    }
    step(&mut ctl, &mut model, 5);
    assert!(scavengers.iter().all(|s| node_of(&model, s).is_some()));
    let mut gang = Vec::new();
    for i in 0..2 {
        let mut t = PodTemplate::new(&format!("train{i}"), 1000, 4);
        t.group = Some(("train".into(), 2));
        gang.push(model.create(&t));
    }
    step(&mut ctl, &mut model, 5);
    let plans = plans(&ctl);
    assert_eq!(plans.len(), 1);
    assert_eq!(
        plans[0].victims.len(),
        8,
        "4 GPUs per pod, 1 GPU per victim"
    );
    assert_eq!(plans[0].reservations.len(), 2);
    assert!(
        plans[0].message.contains("group sim/train: would preempt"),
        "{}",
        plans[0].message
    );
    finish_terminating(&mut model);
    step(&mut ctl, &mut model, 5);
    assert!(
        gang.iter().all(|g| node_of(&model, g).is_some()),
        "the gang runs"
    );
}

/// Whether pod `uid` would be placed now, with the standing nominations of others applied.
fn fits_with_nominations(model: &ClusterModel, uid: &str) -> bool {
    let pod = model.pod(uid).unwrap();
    let nominations = Nominations::from_pods(model.pods(), TOPOLOGY_AWARE_GATE, model.now);
    let reserved = nominations.reserved_against(pod_priority(pod), &[uid], None);
    let in_use = model.in_use();
    let state = with_reserved(&in_use, &reserved);
    let usage = model.usage();
    let unmanaged = std::sync::Arc::new(tessera_allocator::DeviceIndex::new(
        Vec::new(),
        Vec::new(),
        Vec::new(),
    ));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &state,
        usage: &usage,
    };
    let decision = decide_pod(
        pod,
        &model.claims_of(pod),
        &context,
        &Settings::new(TOPOLOGY_AWARE_GATE),
        model.now,
    );
    matches!(decision.action, Action::Place(_))
}

#[test]
fn nominated_devices_are_not_taken_by_pods_of_equal_or_lower_priority() {
    let (mut model, mut ctl, _) = full_node();
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    step(&mut ctl, &mut model, 5);
    assert_eq!(plans(&ctl).len(), 1);
    // The victims are gone; the nominee has not been decided again yet.
    finish_terminating(&mut model);
    let peer = model.create(&PodTemplate::new("peer", 1000, 4));
    let low = model.create(&PodTemplate::new("low", 0, 1));
    let urgent = model.create(&PodTemplate::new("urgent", 2000, 4));
    assert!(fits_with_nominations(&model, &prod), "its own devices");
    assert!(
        !fits_with_nominations(&model, &peer),
        "equal priority waits"
    );
    assert!(!fits_with_nominations(&model, &low), "lower priority waits");
    assert!(
        fits_with_nominations(&model, &urgent),
        "a higher priority is not held back by a nomination"
    );
}

#[test]
fn a_claim_is_freed_only_when_every_pod_reserving_it_is_a_victim() {
    let (mut model, _, batch) = full_node();
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    let PreemptionOutcome::Preempt(plan) = search(&model, &prod) else {
        panic!("b2 and b3 make room");
    };
    assert_eq!(plan.victims[0].uid, batch[2]);
    // A running pod of higher priority shares the claims of b2 and b3: evicting them frees
    // nothing, so b0 and b1 go instead.
    let mut sharer = model.pod(&batch[0]).unwrap().clone();
    sharer.metadata.name = Some("sharer".into());
    sharer.metadata.uid = Some("sharer".into());
    sharer.spec.as_mut().unwrap().priority = Some(5000);
    let mut pods: Vec<Pod> = model.pods().cloned().collect();
    pods.push(sharer);
    let claims = model
        .claims()
        .map(|c| {
            let mut c = (**c).clone();
            let shared = ["b2-gpus", "b3-gpus"].contains(&c.metadata.name.as_deref().unwrap());
            if shared {
                let reserved = c.status.as_mut().unwrap().reserved_for.as_mut().unwrap();
                let mut other = reserved[0].clone();
                other.name = "sharer".into();
                other.uid = "sharer".into();
                reserved.push(other);
            }
            std::sync::Arc::new(c)
        })
        .collect();
    let PreemptionOutcome::Preempt(plan) = search_with(&model, &prod, pods, claims) else {
        panic!("b0 and b1 make room");
    };
    let victims: Vec<&str> = plan.victims.iter().map(|v| v.uid.as_str()).collect();
    assert_eq!(victims, [batch[0].as_str(), batch[1].as_str()]);
    assert!(
        plan.message.contains("to free gpu-0..3 of dgx-000"),
        "{}",
        plan.message
    );
}

#[test]
fn a_waiting_gang_holds_back_lower_and_later_equal_priorities_but_never_a_higher_one() {
    let mut model = cluster(1, 1);
    let mut ctl = controller(false);
    let running: Vec<String> = (0..8)
        .map(|i| model.create(&batch(&format!("b{i}"), 0, 1)))
        .collect();
    step(&mut ctl, &mut model, 5);
    let mut gang = Vec::new();
    for i in 0..2 {
        let mut t = PodTemplate::new(&format!("g{i}"), 0, 3);
        t.group = Some(("train".into(), 2));
        gang.push(model.create(&t));
    }
    step(&mut ctl, &mut model, 61);
    // The gang has waited past the hold: a later pod of its priority waits behind it, a
    // higher one does not.
    let later = model.create(&batch("later", 0, 1));
    let urgent = model.create(&PodTemplate::new("urgent", 1000, 1));
    model.remove(&running[0]);
    model.remove(&running[1]);
    step(&mut ctl, &mut model, 5);
    assert!(
        node_of(&model, &urgent).is_some(),
        "a higher priority is never held back"
    );
    assert!(node_of(&model, &later).is_none(), "held back by the gang");
    // Once enough is free the gang goes first, then the later pod.
    for b in &running[2..] {
        model.remove(b);
    }
    step(&mut ctl, &mut model, 5);
    assert!(
        gang.iter().all(|g| node_of(&model, g).is_some()),
        "the gang runs"
    );
    assert!(node_of(&model, &later).is_some(), "no longer held back");
}

/// Runs a 2-GPU pod of priority 0 on `devices` of dgx-000, started `minutes` before now.
fn run_for(model: &mut ClusterModel, name: &str, devices: [&str; 2], minutes: i64) -> String {
    let now = model.now;
    model.now = now
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_mins(minutes))
        .unwrap();
    let devices: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
    let uid = model
        .run_placed(&batch(name, 0, 2), "dgx-000", &devices)
        .expect("free devices");
    model.now = now;
    uid
}

#[test]
fn among_equally_many_victims_of_equal_priority_topology_wins_over_a_few_gpu_hours() {
    // gpu-0..3 are NUMA node 0, gpu-4..7 NUMA node 1. The two pods that ran least hold gpu-2,3
    // and gpu-4,5: evicting them loses the fewest GPU-hours but frees devices on both NUMA nodes.
    let mut model = cluster(1, 1);
    run_for(&mut model, "b0", ["gpu-0", "gpu-1"], 240);
    run_for(&mut model, "b1", ["gpu-2", "gpu-3"], 10);
    run_for(&mut model, "b2", ["gpu-4", "gpu-5"], 11);
    run_for(&mut model, "b3", ["gpu-6", "gpu-7"], 180);
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    let PreemptionOutcome::Preempt(plan) = search(&model, &prod) else {
        panic!("two victims make room");
    };
    let victims: Vec<&str> = plan.victims.iter().map(|v| v.pod.as_str()).collect();
    assert_eq!(
        victims,
        ["sim/b2", "sim/b3"],
        "one NUMA node (the one whose pods ran least), not the cheapest set across both: {}",
        plan.message
    );
    assert_eq!(
        plan.reservations[0].devices.len(),
        4,
        "the preemptor's four devices"
    );
    let names: Vec<&str> = plan.reservations[0]
        .devices
        .iter()
        .map(|d| d.device())
        .collect();
    assert_eq!(names, ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
}

/// `nodes` dgx-h100 nodes in racks of 8, every GPU held by a 2-GPU pod (started 1 to 8 hours
/// ago): on each node one of priority -10 on gpu-0,1, three of priority 0.
fn full_cluster(nodes: usize) -> ClusterModel {
    let mut model = cluster(nodes, 8);
    let now = model.now;
    for n in 0..nodes {
        for p in 0..4 {
            model.now = now
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_mins(
                    60 + ((n * 4 + p) * 37 % 420) as i64,
                ))
                .unwrap();
            let devices = vec![format!("gpu-{}", 2 * p), format!("gpu-{}", 2 * p + 1)];
            model
                .run_placed(
                    &batch(&format!("b{n}-{p}"), if p == 0 { -10 } else { 0 }, 2),
                    &format!("dgx-{n:03}"),
                    &devices,
                )
                .expect("free devices");
        }
    }
    model.now = now;
    model
}

/// The search for the gang of pods `uids` (all of group `name`).
fn search_group(model: &ClusterModel, name: &str, uids: &[String]) -> PreemptionDecision {
    let pods: Vec<Pod> = uids.iter().map(|u| model.pod(u).unwrap().clone()).collect();
    let claims: Vec<_> = pods.iter().map(|p| model.claims_of(p)).collect();
    let victims = Victims::new(
        &ManagedDevices::new(&model.snapshot),
        model.pods(),
        model.claims().cloned(),
        DisruptionBudgets::new(model.budgets()),
        &HashSet::new(),
        model.now,
    );
    let in_use = model.in_use();
    let usage = model.usage();
    let unmanaged = std::sync::Arc::new(tessera_allocator::DeviceIndex::new(
        Vec::new(),
        Vec::new(),
        Vec::new(),
    ));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &in_use,
        usage: &usage,
    };
    let settings = PreemptionSettings::default();
    let input = PreemptionInput {
        victims: &victims,
        reserved: &[],
        refused: &HashSet::new(),
        settings: &settings,
    };
    let key = GroupKey {
        namespace: tessera_placement::simulation::NAMESPACE.into(),
        name: name.into(),
        source: GroupSource::Label,
    };
    let group = GroupInput {
        key: &key,
        min_count: uids.len() as u32,
        placed: 0,
        members: pods
            .iter()
            .zip(&claims)
            .map(|(pod, claims)| Member { pod, claims })
            .collect(),
        unresolved: 0,
        held: 0,
        domain_nodes: Default::default(),
    };
    preempt_group(
        &group,
        &context,
        &Settings::new(TOPOLOGY_AWARE_GATE),
        &GroupSettings::default(),
        &input,
        model.now,
    )
}

#[test]
fn on_a_full_cluster_the_search_takes_few_pod_decisions() {
    // 64 full nodes in 8 racks: the work of a search, counted, not timed. The bounds are what the
    // search takes today; a search that looks at every node or domain again fails them (the
    // gang's first group decision, with the priority -10 pods gone, finds no node with 8 free
    // GPUs: every domain is ruled out by counting instead of attempted).
    let mut model = full_cluster(64);
    let prod = model.create(&PodTemplate::new("prod", 1000, 4));
    let pod = model.pod(&prod).unwrap().clone();
    let decision = search_pod(&model, &pod);
    let plan = decision.plan().expect("two victims make room");
    assert_eq!(plan.victims.len(), 2);
    assert!(
        decision.pod_decisions <= 2 && decision.combinations <= 4,
        "{} pod decisions, {} victim sets",
        decision.pod_decisions,
        decision.combinations
    );
    model.remove(&prod);

    let mut gang = Vec::new();
    for i in 0..2 {
        let mut t = PodTemplate::new(&format!("train-{i}"), 1000, 8);
        t.group = Some(("train".into(), 2));
        gang.push(model.create(&t));
    }
    let decision = search_group(&model, "train", &gang);
    let plan = decision.plan().expect("two nodes' pods make room");
    assert_eq!(
        plan.victims.len(),
        8,
        "four 2-GPU pods on each of two nodes"
    );
    assert!(
        decision.pod_decisions <= 16,
        "{} pod decisions ({} group decisions)",
        decision.pod_decisions,
        decision.steps
    );
}

#[test]
fn a_placement_nothing_can_connect_better_ends_the_tie_search() {
    // One GPU is connected alike wherever it goes (no pair, one NUMA node): the first plan is as
    // well connected as any, so no set of the same rank is checked for a better topology. Eight
    // GPUs take a whole node: every set that fits there frees the same node, so no other set of
    // that node is checked (other nodes still are, for a better connected node).
    let mut model = full_cluster(64);
    let one = model.create(&PodTemplate::new("one", 1000, 1));
    let pod = model.pod(&one).unwrap().clone();
    let decision = search_pod(&model, &pod);
    assert_eq!(decision.plan().expect("one victim").victims.len(), 1);
    assert_eq!(
        (decision.steps, decision.combinations),
        (1, 1),
        "one placement check, one victim set"
    );
    model.remove(&one);
    let whole = model.create(&PodTemplate::new("whole", 1000, 8));
    let pod = model.pod(&whole).unwrap().clone();
    let decision = search_pod(&model, &pod);
    assert_eq!(decision.plan().expect("a node's pods").victims.len(), 4);
    assert!(
        decision.steps <= 9,
        "{} placement checks: one per node searched, the first node's and at most 8 tied nodes",
        decision.steps
    );
}

/// The search for `pod` with its decision's counts.
fn search_pod(model: &ClusterModel, pod: &Pod) -> PreemptionDecision {
    let victims = Victims::new(
        &ManagedDevices::new(&model.snapshot),
        model.pods(),
        model.claims().cloned(),
        DisruptionBudgets::new(model.budgets()),
        &HashSet::new(),
        model.now,
    );
    let in_use = model.in_use();
    let usage = model.usage();
    let unmanaged = std::sync::Arc::new(tessera_allocator::DeviceIndex::new(
        Vec::new(),
        Vec::new(),
        Vec::new(),
    ));
    let unmanaged_fn = || unmanaged.clone();
    let context = PodContext {
        devices: &model.snapshot,
        unmanaged: &unmanaged_fn,
        in_use: &in_use,
        usage: &usage,
    };
    let settings = PreemptionSettings::default();
    let input = PreemptionInput {
        victims: &victims,
        reserved: &[],
        refused: &HashSet::new(),
        settings: &settings,
    };
    preempt_pod(
        pod,
        &model.claims_of(pod),
        &context,
        &Settings::new(TOPOLOGY_AWARE_GATE),
        &input,
        model.now,
    )
}
