//! IMEX domains on topology-managed GB200 trays, decided as the controller and `tessera explain`
//! decide them: a gang whose pods share one claim of class `imex.gpu.tessera.dev` is placed in one
//! fabric clique with one channel written once, or waits saying which clique came closest or
//! which channels are taken.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodSchedulingGate, PodSpec};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use tessera_api::imex::IMEX_DEVICE_CLASS;
use tessera_api::names::{
    GPU_DEVICE_CLASS, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE,
};
use tessera_placement::group::{GroupOutcome, GroupPlan};
use tessera_placement::planner::Action;
use tessera_placement::synthetic::device_claim;
use tessera_placement::view::Settings;
use tessera_placement::{ClusterObjects, GroupVerdict, Ruling};

use support::imex::{CLUSTER_UUID, gb200_cluster};

const NS: &str = "ml";

fn now() -> Timestamp {
    "2026-11-29T08:00:00Z".parse().unwrap()
}

/// Gang `name` of `pods` pods, each with its own claim of `gpus` GPUs and the shared domain claim
/// `<name>-domain`.
fn domain_gang(objects: &mut ClusterObjects, name: &str, pods: usize, gpus: i64) {
    let domain = format!("{name}-domain");
    objects.claims.push(device_claim(
        NS,
        &domain,
        &format!("uid-{domain}"),
        IMEX_DEVICE_CLASS,
        1,
    ));
    for i in 0..pods {
        let claim = format!("{name}-{i}-gpus");
        objects.claims.push(device_claim(
            NS,
            &claim,
            &format!("uid-{claim}"),
            GPU_DEVICE_CLASS,
            gpus,
        ));
        objects.pods.push(member(name, i, pods, &claim, &domain));
    }
}

fn member(group: &str, i: usize, min: usize, claim: &str, domain: &str) -> Pod {
    let name = format!("{group}-{i}");
    Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            creation_timestamp: Some(Time("2026-11-29T07:00:00Z".parse().unwrap())),
            labels: Some(BTreeMap::from([(GROUP_LABEL.into(), group.into())])),
            annotations: Some(BTreeMap::from([(
                GROUP_MIN_COUNT_ANNOTATION.into(),
                min.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            scheduling_gates: Some(vec![PodSchedulingGate {
                name: TOPOLOGY_AWARE_GATE.into(),
            }]),
            resource_claims: Some(vec![
                PodResourceClaim {
                    name: "gpus".into(),
                    resource_claim_name: Some(claim.into()),
                    ..Default::default()
                },
                PodResourceClaim {
                    name: "domain".into(),
                    resource_claim_name: Some(domain.into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The group plan for the first pod of gang `name`.
fn plan(objects: &ClusterObjects, name: &str) -> GroupPlan {
    let pod = objects.pod(NS, &format!("{name}-0")).unwrap();
    match objects.decide(pod, &[], &Settings::new(TOPOLOGY_AWARE_GATE), now()) {
        Ruling::Group(GroupVerdict::Decided { plan, .. }) => plan,
        other => panic!("not a group decision: {other:?}"),
    }
}

/// What a placed plan writes: claim name → (device pool, device names), and each pod's node.
type Written = (BTreeMap<String, Vec<(String, String)>>, Vec<String>);

fn written(plan: &GroupPlan) -> Written {
    let GroupOutcome::Place { plans, .. } = &plan.outcome else {
        panic!("the gang waits: {:?}", plan.outcome);
    };
    let mut claims: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut nodes = Vec::new();
    for (_, member) in plans {
        let Action::Place(placement) = &member.action else {
            panic!("{member:?}");
        };
        nodes.push(placement.node.clone());
        for write in &placement.writes {
            let name = write.claim.metadata.name.clone().unwrap();
            let devices: Vec<(String, String)> = write
                .allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| (r.pool.clone(), r.device.clone()))
                .collect();
            assert!(
                claims.insert(name.clone(), devices).is_none(),
                "claim {name} written twice in one decision"
            );
        }
    }
    (claims, nodes)
}

/// Allocates what a placed plan writes into `objects` (the claims' status), as the controller's
/// writes would.
fn apply(objects: &mut ClusterObjects, plan: &GroupPlan) {
    let GroupOutcome::Place { plans, .. } = &plan.outcome else {
        panic!("the gang waits");
    };
    for (_, member) in plans {
        let Action::Place(placement) = &member.action else {
            continue;
        };
        for write in &placement.writes {
            let claim: &mut ResourceClaim = objects
                .claims
                .iter_mut()
                .find(|c| c.metadata.name == write.claim.metadata.name)
                .unwrap();
            claim.status.get_or_insert_with(Default::default).allocation =
                Some(write.allocation.clone());
        }
    }
}

fn clique(id: u32) -> String {
    format!("{CLUSTER_UUID}.{id}")
}

#[test]
fn a_domain_gang_gets_one_channel_written_once_and_stays_in_one_clique() {
    // Clique 1 has 3 trays, clique 2 has 5: a gang of 4 trays fits only in clique 2.
    let mut objects = gb200_cluster(&[(1, 3), (2, 5)], 4);
    domain_gang(&mut objects, "train", 4, 4);
    let plan = plan(&objects, "train");
    let (claims, nodes) = written(&plan);
    assert_eq!(
        claims["train-domain"],
        [(format!("imex-{}", clique(2)), "channel-0".to_owned())],
        "one channel of the gang's clique, written once"
    );
    assert_eq!(claims.len(), 5, "4 GPU claims and the domain: {claims:?}");
    assert!(
        nodes.iter().all(|n| n.starts_with("tray-2-")),
        "every pod in clique 2: {nodes:?}"
    );
    let mut distinct = nodes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "one pod per tray: {nodes:?}");
    for (claim, devices) in &claims {
        if claim != "train-domain" {
            assert!(
                devices.iter().all(|(_, d)| d.starts_with("gpu-")),
                "{claim}"
            );
        }
    }
}

#[test]
fn two_live_domains_of_one_clique_get_two_channels() {
    let mut objects = gb200_cluster(&[(1, 6)], 4);
    domain_gang(&mut objects, "a", 2, 4);
    domain_gang(&mut objects, "b", 2, 4);
    let first = plan(&objects, "a");
    apply(&mut objects, &first);
    objects.pods.retain(|p| {
        !p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("a-"))
    });
    let second = plan(&objects, "b");
    let (a, _) = written(&first);
    let (b, _) = written(&second);
    assert_eq!(a["a-domain"][0].1, "channel-0");
    assert_eq!(
        b["b-domain"][0].1, "channel-1",
        "channel-0 is a's while a lives"
    );
}

#[test]
fn a_domain_gang_waits_naming_the_clique_with_the_most_free_trays() {
    let mut objects = gb200_cluster(&[(1, 3), (2, 2)], 4);
    domain_gang(&mut objects, "big", 4, 4);
    let plan = plan(&objects, "big");
    let GroupOutcome::Wait { message, .. } = &plan.outcome else {
        panic!("placed across cliques: {:?}", plan.outcome);
    };
    let expected = format!(
        "no fabric clique has 4 free trays for the IMEX domain ml/big-domain: the most, 3, are in clique {}",
        clique(1)
    );
    assert!(message.contains(&expected), "{message}");
}

#[test]
fn a_domain_gang_waits_for_a_channel_naming_the_domains_that_hold_them() {
    // Two channels per clique, both held by running domains; trays are free.
    let mut objects = gb200_cluster(&[(1, 6)], 2);
    for name in ["a", "b"] {
        domain_gang(&mut objects, name, 1, 4);
        let placed = plan(&objects, name);
        apply(&mut objects, &placed);
        objects
            .pods
            .retain(|p| p.metadata.name.as_deref() != Some(&format!("{name}-0")));
    }
    domain_gang(&mut objects, "late", 2, 4);
    let plan = plan(&objects, "late");
    let GroupOutcome::Wait { message, .. } = &plan.outcome else {
        panic!("a third domain got a channel: {:?}", plan.outcome);
    };
    let expected = format!(
        "no free IMEX channel in clique {c} (2 of 2 in use); the channels of clique {c} are held by the domains ml/a-domain, ml/b-domain",
        c = clique(1)
    );
    assert!(message.contains(&expected), "{message}");
}

/// The last pod added, out of its gang, decided alone: why it cannot be placed.
fn cannot_place_alone(objects: &mut ClusterObjects) -> String {
    let mut alone = objects.pods.pop().unwrap();
    alone.metadata.labels = None;
    alone.metadata.annotations = None;
    objects.pods.push(alone.clone());
    let ruling = objects.decide(&alone, &[], &Settings::new(TOPOLOGY_AWARE_GATE), now());
    let Ruling::Pod(tessera_placement::PodVerdict::Decided(plan)) = ruling else {
        panic!("{ruling:?}");
    };
    match plan.action {
        Action::CannotPlace { message, .. } => message,
        other => panic!("placed: {other:?}"),
    }
}

#[test]
fn a_domain_pod_alone_waits_saying_no_clique_has_a_free_channel() {
    let mut objects = gb200_cluster(&[(1, 3)], 1);
    domain_gang(&mut objects, "a", 1, 4);
    let placed = plan(&objects, "a");
    apply(&mut objects, &placed);
    objects.pods.clear();
    // A pod of another domain, not in a gang.
    domain_gang(&mut objects, "solo", 1, 4);
    let message = cannot_place_alone(&mut objects);
    let expected = format!(
        "no free IMEX channel for the domain ml/solo-domain in any clique (clique {}: 1 of 1 in use)",
        clique(1)
    );
    assert!(message.contains(&expected), "{message}");
}

/// Places gang `name` (asserting it fits) and binds its pods to their nodes; returns the nodes.
fn place_and_bind(objects: &mut ClusterObjects, name: &str) -> Vec<String> {
    let placed = plan(objects, name);
    let (_, nodes) = written(&placed);
    apply(objects, &placed);
    let GroupOutcome::Place { plans, .. } = &placed.outcome else {
        unreachable!("written() asserted the placement");
    };
    for (index, member) in plans {
        let Action::Place(placement) = &member.action else {
            continue;
        };
        let pod = format!("{name}-{index}");
        let pod = objects
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
            .unwrap();
        let spec = pod.spec.as_mut().unwrap();
        spec.scheduling_gates = None;
        spec.node_name = Some(placement.node.clone());
    }
    nodes
}

#[test]
fn a_domain_gang_keeps_off_a_tray_where_another_domains_pod_runs() {
    // Three trays of 4 GPUs; another domain's pod holds 2 GPUs of one of them. The gang's four
    // 2-GPU pods fill the other two trays exactly, never the 2 GPUs left beside the other domain.
    let mut objects = gb200_cluster(&[(1, 3)], 4);
    domain_gang(&mut objects, "other", 1, 2);
    let taken = place_and_bind(&mut objects, "other");
    domain_gang(&mut objects, "train", 4, 2);
    let (_, nodes) = written(&plan(&objects, "train"));
    assert_eq!(nodes.len(), 4, "{nodes:?}");
    assert!(
        nodes.iter().all(|n| !taken.contains(n)),
        "a pod of ml/train-domain placed beside ml/other-domain on {taken:?}: {nodes:?}"
    );
}

#[test]
fn a_domain_gang_waits_when_every_roomy_tray_hosts_another_domain() {
    // Two trays, each with a 3-GPU pod of another domain: one GPU free on each, enough for the
    // gang's 1-GPU pods, but each tray's IMEX daemon is the other domain's.
    let mut objects = gb200_cluster(&[(1, 2)], 4);
    domain_gang(&mut objects, "other", 2, 3);
    let mut taken = place_and_bind(&mut objects, "other");
    taken.sort();
    domain_gang(&mut objects, "train", 2, 1);
    let plan = plan(&objects, "train");
    let GroupOutcome::Wait { message, .. } = &plan.outcome else {
        panic!("placed beside another domain: {:?}", plan.outcome);
    };
    let expected = format!(
        "no fabric clique has 2 free trays for the IMEX domain ml/train-domain: the most, 0, are in clique {}; {} runs pods of the IMEX domain ml/other-domain (one IMEX domain per node)",
        clique(1),
        taken[0]
    );
    assert!(message.contains(&expected), "{message}");
}

#[test]
fn a_domain_pod_alone_keeps_off_a_tray_where_another_domains_pod_runs() {
    // One tray, half of it used by another domain's pod: room for the lone pod's 2 GPUs, but
    // not for a second IMEX daemon.
    let mut objects = gb200_cluster(&[(1, 1)], 4);
    domain_gang(&mut objects, "other", 1, 2);
    let taken = place_and_bind(&mut objects, "other");
    domain_gang(&mut objects, "solo", 1, 2);
    let message = cannot_place_alone(&mut objects);
    let expected = format!(
        "{} runs pods of the IMEX domain ml/other-domain (one IMEX domain per node)",
        taken[0]
    );
    assert!(message.contains(&expected), "{message}");
}
