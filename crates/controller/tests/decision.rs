//! The decision as data: what `tessera_placement::decide::decide` tells the worker to do, in
//! order, for a pod alone and for a group — checked on the steps themselves, no API server
//! involved (the controller's tests against the fake check that the worker carries them out).

use tessera_controller_harness as support;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::*;
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE};
use tessera_placement::decide::decide;
use tessera_placement::decision::{
    Count, Decision, GroupVerdict, PodPatch, PodVerdict, Ruling, Step, Then,
};
use tessera_placement::group::{GroupKey, GroupSource, Waiting};
use tessera_placement::{ClusterObjects, EventKind, PodReason, Settings};

fn now() -> Timestamp {
    "2026-11-22T10:00:00Z".parse().unwrap()
}

/// DGX H100 nodes `names` (8 managed GPUs each), the shipped classes, no pods or claims yet.
fn cluster(names: &[&str]) -> ClusterObjects {
    ClusterObjects {
        slices: names.iter().flat_map(|n| dgx_slices(n, true)).collect(),
        classes: shipped_classes(),
        nodes: names.iter().map(|n| node(n, true)).collect(),
        ..ClusterObjects::default()
    }
}

/// A gated pod with one claim `<name>-gpus` for `gpus` GPUs, created at `created`.
fn pod(objects: &mut ClusterObjects, name: &str, gpus: i64, created: &str) -> Pod {
    let claim = format!("{name}-gpus");
    let mut pod = gated_pod(name, &[("gpus", Source::Claim(&claim))]);
    pod.metadata.creation_timestamp = Some(Time(created.parse().unwrap()));
    objects.claims.push(gpu_claim(&claim, gpus));
    pod
}

/// Adds a gated pod (see [`pod`]).
fn add_pod(objects: &mut ClusterObjects, name: &str, gpus: i64, created: &str) -> Arc<Pod> {
    let pod = pod(objects, name, gpus, created);
    objects.pods.push(pod.clone());
    Arc::new(pod)
}

/// Adds `size` pods of the label-named group `name` (minCount `size`), each asking `gpus` GPUs.
fn add_group(objects: &mut ClusterObjects, name: &str, size: usize, gpus: i64) -> Vec<Arc<Pod>> {
    (0..size)
        .map(|i| {
            let mut pod = pod(
                objects,
                &format!("{name}-{i}"),
                gpus,
                "2026-11-22T09:00:00Z",
            );
            pod.metadata.labels = Some(BTreeMap::from([(GROUP_LABEL.into(), name.into())]));
            pod.metadata.annotations = Some(BTreeMap::from([(
                GROUP_MIN_COUNT_ANNOTATION.into(),
                size.to_string(),
            )]));
            objects.pods.push(pod.clone());
            Arc::new(pod)
        })
        .collect()
}

fn decided(objects: &ClusterObjects, pod: &Arc<Pod>, waiting: &[Waiting]) -> Decision {
    let settings = Settings::new(TOPOLOGY_AWARE_GATE);
    decide(pod, &objects.source(&[]), waiting, &settings, now())
}

/// A step as a short word and the pod it concerns, to compare orders.
fn shape(step: &Step) -> String {
    let name = |pod: &Pod| pod.metadata.name.clone().unwrap_or_default();
    match step {
        Step::Undo { pod, claim } => format!(
            "undo {} of {}",
            claim.metadata.name.as_deref().unwrap_or_default(),
            name(pod)
        ),
        Step::Allocate { pod, write, .. } => format!(
            "allocate {} of {}",
            write.claim.metadata.name.as_deref().unwrap_or_default(),
            name(pod)
        ),
        Step::PatchPod {
            pod,
            patch: PodPatch::AvoidNodes(_),
        } => format!("avoid nodes {}", name(pod)),
        Step::PatchPod {
            pod,
            patch: PodPatch::Release { record, .. },
        } => match record {
            Some(record) => format!("release {} on {}", name(pod), record.node),
            None => format!("release {} unrecorded", name(pod)),
        },
        Step::Notify { pod, notice } => format!("report {} {}", name(pod), notice.reason),
        Step::CreateTemplate { pod, template } => format!(
            "create template {} for {}",
            template.metadata.name.as_deref().unwrap_or_default(),
            name(pod)
        ),
        Step::Count(count) => format!("count {count:?}"),
        Step::Remember(w) => format!("remember {}", w.key),
        Step::Forget(key) => format!("forget {key}"),
        Step::Nominate { pod, nomination } => match nomination {
            Some(n) => format!("nominate {} on {}", name(pod), n.node),
            None => format!("withdraw the nomination of {}", name(pod)),
        },
        Step::Evict {
            victim,
            preemptor,
            committed,
            ..
        } => format!(
            "evict {} for {}{}",
            name(victim),
            name(preemptor),
            if *committed { " (committed)" } else { "" }
        ),
    }
}

fn shapes(steps: &[Step]) -> Vec<String> {
    steps.iter().map(shape).collect()
}

#[test]
fn a_placed_pod_has_its_claims_written_first_then_is_released_and_told() {
    let mut objects = cluster(&["dgx-a"]);
    let pod = add_pod(&mut objects, "trainer", 4, "2026-11-22T09:00:00Z");
    let decision = decided(&objects, &pod, &[]);
    assert!(matches!(
        decision.ruling,
        Ruling::Pod(PodVerdict::Decided(_))
    ));
    assert_eq!(
        shapes(&decision.first),
        [
            "allocate trainer-gpus of trainer",
            "count ClaimsAllocated(1)"
        ]
    );
    let per_pod: Vec<Vec<String>> = decision.per_pod.iter().map(|s| shapes(s)).collect();
    assert_eq!(
        per_pod,
        [[
            "release trainer on dgx-a",
            "count PodPlaced",
            "report trainer Allocated"
        ]]
    );
    let Step::PatchPod {
        patch: PodPatch::Release { gate, .. },
        ..
    } = &decision.per_pod[0][0]
    else {
        panic!("the release comes first");
    };
    assert_eq!(gate.as_deref(), Some(TOPOLOGY_AWARE_GATE));
    assert_eq!(decision.then, Then::Done);
}

#[test]
fn a_pod_that_does_not_fit_is_counted_told_with_a_warning_and_parked() {
    let mut objects = cluster(&["dgx-a"]);
    let pod = add_pod(&mut objects, "huge", 16, "2026-11-22T09:00:00Z");
    let decision = decided(&objects, &pod, &[]);
    assert_eq!(shapes(&decision.first), ["count Failure(Unsatisfiable)"]);
    let Step::Notify { notice, .. } = &decision.per_pod[0][0] else {
        panic!("a report");
    };
    assert_eq!(
        (notice.reason, notice.kind),
        (PodReason::Unsatisfiable, EventKind::Warning)
    );
    assert_eq!(decision.then, Then::Park);
}

#[test]
fn a_waiting_group_holds_a_later_pod_back_and_a_group_without_gated_pods_is_forgotten() {
    let mut objects = cluster(&["dgx-a"]);
    add_group(&mut objects, "early", 2, 8);
    let pod = add_pod(&mut objects, "late", 1, "2026-11-22T09:30:00Z");
    let key = |name: &str| GroupKey {
        namespace: NS.into(),
        name: name.into(),
        source: GroupSource::Label,
    };
    let waiting = |name: &str| Waiting {
        key: key(name),
        priority: 0,
        arrived: "2026-11-22T09:00:00Z".parse().unwrap(),
        since: now() - SignedDuration::from_mins(10),
        fits_when_free: true,
    };
    let decision = decided(&objects, &pod, &[waiting("early"), waiting("gone")]);
    let Ruling::Pod(PodVerdict::HeldBack { by, .. }) = &decision.ruling else {
        panic!("held back: {:?}", decision.ruling);
    };
    assert_eq!(by.key, key("early"));
    assert_eq!(
        shapes(&decision.first),
        [
            format!("forget {}", key("gone")),
            "count Failure(WaitingBehindGroup)".to_owned()
        ]
    );
    assert_eq!(
        shapes(&decision.per_pod[0]),
        ["report late WaitingBehindGroup"]
    );
    assert_eq!(decision.then, Then::Park);
}

#[test]
fn a_placed_group_writes_every_claim_before_releasing_any_pod() {
    let mut objects = cluster(&["dgx-a", "dgx-b"]);
    let pods = add_group(&mut objects, "train", 2, 8);
    let decision = decided(&objects, &pods[1], &[]);
    let Ruling::Group(GroupVerdict::Decided { members, .. }) = &decision.ruling else {
        panic!("the group is decided: {:?}", decision.ruling);
    };
    assert_eq!(members, &["ml/train-0", "ml/train-1"]);
    let first = shapes(&decision.first);
    assert_eq!(first[0], "forget group ml/train");
    assert_eq!(
        first[1..],
        [
            "allocate train-0-gpus of train-0",
            "count ClaimsAllocated(1)",
            "allocate train-1-gpus of train-1",
            "count ClaimsAllocated(1)"
        ]
    );
    let released: Vec<String> = decision.per_pod.iter().map(|s| shape(&s[0])).collect();
    assert_eq!(released.len(), 2);
    assert!(
        released.iter().all(|r| r.starts_with("release train-")),
        "{released:?}"
    );
    assert!(
        decision
            .per_pod
            .iter()
            .all(|s| s.contains(&Step::Count(Count::PodPlaced))),
        "every member is counted once released"
    );
}

#[test]
fn a_group_that_does_not_fit_remembers_itself_undoes_its_leftovers_and_waits() {
    let mut objects = cluster(&["dgx-a", "dgx-b"]);
    let all: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    objects
        .claims
        .push(allocated(gpu_claim("other", 8), "dgx-b", &all));
    let pods = add_group(&mut objects, "big", 2, 8);
    // An earlier leader allocated the first member's claim and stopped half-way.
    let claim = objects
        .claims
        .iter_mut()
        .find(|c| c.metadata.name.as_deref() == Some("big-0-gpus"));
    let claim = claim.unwrap();
    *claim = allocated(
        claim.clone(),
        "dgx-a",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    );
    let mark = tessera_placement::protocol::ClaimMark {
        pod_uid: "uid-big-0".into(),
        pod: "big-0".into(),
        node: "dgx-a".into(),
        finalizer_added: true,
    };
    claim.metadata.annotations = Some(BTreeMap::from([(
        tessera_placement::protocol::CLAIM_MARK_ANNOTATION.to_owned(),
        mark.to_annotation(),
    )]));
    let decision = decided(&objects, &pods[0], &[]);
    let Ruling::Group(GroupVerdict::Decided { .. }) = &decision.ruling else {
        panic!("the group is decided: {:?}", decision.ruling);
    };
    let Step::Remember(waiting) = &decision.first[0] else {
        panic!("remembered first: {:?}", shapes(&decision.first));
    };
    assert!(
        waiting.fits_when_free,
        "the two nodes hold the group when free: {waiting:?}"
    );
    assert_eq!(
        shapes(&decision.first[1..]),
        ["count Failure(Unsatisfiable)", "undo big-0-gpus of big-0"]
    );
    let reports: Vec<String> = decision.per_pod.iter().flat_map(|s| shapes(s)).collect();
    assert_eq!(
        reports,
        [
            "report big-0 GroupUnsatisfiable",
            "report big-1 GroupUnsatisfiable"
        ]
    );
    assert_eq!(decision.then, Then::Park);
}

/// Adds the scheduling gates `gates` after the pod's own (as Kueue's webhook adds its gates).
fn hold(pod: &mut Pod, gates: &[&str]) {
    let spec = pod.spec.as_mut().unwrap();
    let list = spec.scheduling_gates.get_or_insert_with(Vec::new);
    list.extend(
        gates
            .iter()
            .map(|g| k8s_openapi::api::core::v1::PodSchedulingGate {
                name: (*g).to_owned(),
            }),
    );
}

const KUEUE_GATES: [&str; 2] = ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"];

#[test]
fn a_pod_another_gate_holds_gets_nothing_allocated_and_is_told_which_gates() {
    let mut objects = cluster(&["dgx-a"]);
    let mut pod = pod(&mut objects, "queued", 4, "2026-11-22T09:00:00Z");
    hold(&mut pod, &KUEUE_GATES);
    objects.pods.push(pod.clone());
    let decision = decided(&objects, &Arc::new(pod), &[]);
    let Ruling::Pod(PodVerdict::WaitingForGates { gates, message }) = &decision.ruling else {
        panic!("waits for the gates: {:?}", decision.ruling);
    };
    assert_eq!(gates, &KUEUE_GATES);
    assert!(
        message.contains("kueue.x-k8s.io/admission, kueue.x-k8s.io/topology")
            && message.contains("Kueue removes its gates"),
        "{message}"
    );
    assert!(
        decision.first.is_empty(),
        "nothing written, nothing counted"
    );
    let per_pod: Vec<Vec<String>> = decision.per_pod.iter().map(|s| shapes(s)).collect();
    assert_eq!(per_pod, [["report queued WaitingForGates"]]);
    let Step::Notify { notice, .. } = &decision.per_pod[0][0] else {
        panic!("a report");
    };
    assert_eq!(notice.kind, EventKind::Normal);
    assert_eq!(
        decision.then,
        Then::Done,
        "not parked: removing a gate changes the pod, which queues it again"
    );
    assert!(!decision.ruling.planned());
}

#[test]
fn a_released_pod_another_gate_still_holds_keeps_its_claims_and_is_left_alone() {
    let mut objects = cluster(&["dgx-a"]);
    let mut pod = pod(&mut objects, "early", 4, "2026-11-22T09:00:00Z");
    // Released (its gate removed, its placement recorded) while someone else's gate stayed.
    let spec = pod.spec.as_mut().unwrap();
    spec.scheduling_gates = Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
        name: "example.com/hold".into(),
    }]);
    let record = tessera_placement::protocol::PodPlacement {
        node: "dgx-a".into(),
        ..Default::default()
    };
    pod.metadata.annotations = Some(BTreeMap::from([(
        tessera_placement::protocol::POD_PLACEMENT_ANNOTATION.to_owned(),
        record.to_annotation(),
    )]));
    objects.pods.push(pod.clone());
    let decision = decided(&objects, &Arc::new(pod), &[]);
    let Ruling::Pod(PodVerdict::WaitingForGates { gates, message }) = &decision.ruling else {
        panic!("waits for the gate: {:?}", decision.ruling);
    };
    assert_eq!(gates, &["example.com/hold"]);
    assert!(message.starts_with("released already"), "{message}");
    assert!(decision.first.is_empty() && decision.per_pod.is_empty());
    assert_eq!(decision.then, Then::Done);
}

#[test]
fn a_group_waits_while_a_member_is_held_by_another_gate_and_tells_only_the_free_members() {
    let mut objects = cluster(&["dgx-a", "dgx-b"]);
    let pods = add_group(&mut objects, "train", 2, 8);
    let held = objects
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("train-1"))
        .unwrap();
    hold(held, &["example.com/hold"]);
    let held = Arc::new(held.clone());
    let decision = decided(&objects, &pods[0], &[]);
    let Ruling::Group(GroupVerdict::Decided { members, plan, .. }) = &decision.ruling else {
        panic!("the group is decided: {:?}", decision.ruling);
    };
    assert_eq!(members, &["ml/train-0"], "the held member is not placed");
    let tessera_placement::group::GroupOutcome::Wait {
        reason, message, ..
    } = &plan.outcome
    else {
        panic!("the group waits: {:?}", plan.outcome);
    };
    assert_eq!(*reason, PodReason::WaitingForGroup);
    assert!(
        message.contains("1 of them exist but are held by other scheduling gates"),
        "{message}"
    );
    assert!(
        !shapes(&decision.first)
            .iter()
            .any(|s| s.starts_with("allocate")),
        "nothing allocated: {:?}",
        shapes(&decision.first)
    );
    let reports: Vec<String> = decision.per_pod.iter().flat_map(|s| shapes(s)).collect();
    assert_eq!(reports, ["report train-0 WaitingForGroup"]);
    // The held member itself waits for its gate.
    let decision = decided(&objects, &held, &[]);
    assert!(matches!(
        decision.ruling,
        Ruling::Pod(PodVerdict::WaitingForGates { .. })
    ));
}

/// Adds a pod running on dgx-0 since `started`, of `priority`, holding `devices` through its
/// claim (named like the pod).
fn add_running(
    objects: &mut ClusterObjects,
    name: &str,
    priority: i32,
    started: &str,
    devices: &[&str],
) {
    let mut claim = allocated(gpu_claim(name, devices.len() as i64), "dgx-0", devices);
    claim.status.as_mut().unwrap().reserved_for = Some(vec![
        k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            api_group: None,
        },
    ]);
    objects.claims.push(claim);
    let mut pod = gated_pod(name, &[("gpus", Source::Claim(name))]);
    let spec = pod.spec.as_mut().unwrap();
    spec.scheduling_gates = None;
    spec.node_name = Some("dgx-0".into());
    spec.priority = Some(priority);
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Running".into()),
        start_time: Some(Time(started.parse().unwrap())),
        ..Default::default()
    });
    objects.pods.push(pod);
}

#[test]
fn a_pod_that_fits_only_by_preempting_is_nominated_then_evicts_the_cheapest_victim() {
    let mut objects = cluster(&["dgx-0"]);
    let numa0 = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"];
    let numa1 = ["gpu-4", "gpu-5", "gpu-6", "gpu-7"];
    add_running(&mut objects, "old", 0, "2026-11-22T09:00:00Z", &numa0);
    add_running(&mut objects, "young", 0, "2026-11-22T09:55:00Z", &numa1);
    let mut prod = pod(&mut objects, "prod", 4, "2026-11-22T09:59:00Z");
    prod.spec.as_mut().unwrap().priority = Some(1000);
    objects.pods.push(prod.clone());
    let prod = Arc::new(prod);

    let decision = decided(&objects, &prod, &[]);
    let Ruling::Pod(PodVerdict::Preempting {
        nomination,
        preemption: Some(plan),
        ..
    }) = &decision.ruling
    else {
        panic!("preempting: {:?}", decision.ruling);
    };
    assert_eq!(nomination.node, "dgx-0");
    let nominated: Vec<&str> = nomination
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .collect();
    assert_eq!(nominated, numa1, "the victim's devices, one NUMA node");
    assert!(plan.message.contains("ml/young"), "{}", plan.message);
    assert_eq!(
        shapes(&decision.first),
        [
            "nominate prod on dgx-0".to_owned(),
            "evict young for prod".to_owned(),
            // Five minutes on four GPUs: the least work lost.
            format!(
                "count {:?}",
                Count::Preemption {
                    victims: 1,
                    gpu_seconds: 1200
                }
            ),
        ]
    );
    assert_eq!(
        shapes(&decision.per_pod.concat()),
        ["report prod Preempting"]
    );
    assert_eq!(decision.then, Then::Park);

    // In line: the priority-1000 pod goes before a default-priority one created earlier.
    let batch = add_pod(&mut objects, "batch", 1, "2026-11-22T09:00:00Z");
    let ahead: Vec<String> = objects
        .ahead_of(&batch, TOPOLOGY_AWARE_GATE)
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(ahead, ["prod"]);
    assert!(objects.ahead_of(&prod, TOPOLOGY_AWARE_GATE).is_empty());

    // Of equal priority it preempts nobody, and says why.
    let mut peer = pod(&mut objects, "peer", 4, "2026-11-22T09:59:00Z");
    peer.spec.as_mut().unwrap().priority = Some(0);
    objects.pods.push(peer.clone());
    let decision = decided(&objects, &Arc::new(peer), &[]);
    let Ruling::Pod(PodVerdict::Decided(plan)) = &decision.ruling else {
        panic!("no preemption: {:?}", decision.ruling);
    };
    let tessera_placement::Action::CannotPlace { message, .. } = &plan.action else {
        panic!("cannot place: {:?}", plan.action);
    };
    assert!(message.contains("preemption cannot make room"), "{message}");
    assert!(
        !shapes(&decision.first)
            .iter()
            .any(|s| s.starts_with("evict"))
    );
}
