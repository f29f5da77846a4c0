//! Preemption over random traces: pods and gangs of several priorities arrive, run, finish; the
//! controller places or preempts; evictions succeed, are refused by budgets or transiently;
//! victims stop at once or ignore SIGTERM until their grace period ends; preemptors are deleted
//! while their victims terminate; leaders change (everything the controller remembers is lost,
//! the annotations stay). After every step and at the end the invariants must hold:
//!
//! - no device is allocated twice (the model refuses such a write, failing the step);
//! - no gang is split: a gang is placed with at least minCount pods at once, a victim gang is
//!   planned whole, and no gang is left with a pod evicted and another running;
//! - no victim has a priority equal to or above its preemptor's;
//! - budgets are respected: a plan's evictions fit the budgets when it is made (no first attempt
//!   is refused by a budget, refusals the test injects aside; a retry may be, when a budget was
//!   created or changed since);
//! - every preemption completes or is released: once the trace drains, no pod is left
//!   nominated, and every preemptor still waiting had its nomination released.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::jiff::SignedDuration;
use proptest::prelude::*;
use tessera_placement::group::group_key;
use tessera_placement::preemption::nomination::{Nomination, PreemptedBy};
use tessera_placement::preemption::pod_priority;
use tessera_placement::simulation::{
    BudgetTemplate, ClusterModel, ControllerModel, Event, PodTemplate, Refusal, is_running,
};

use support::{cluster, controller};

const PRIORITIES: [i32; 4] = [-10, 0, 100, 1000];

#[derive(Clone, Debug)]
enum Op {
    /// A pod (or a gang of `members` pods) of `gpus` each.
    Arrive {
        priority: usize,
        gpus: u32,
        members: u32,
        never: bool,
        grace: i64,
        ignores_sigterm: bool,
        tier: u8,
    },
    /// The `n`th running pod finishes (with its whole gang).
    Finish(usize),
    /// The `n`th gated pod is deleted.
    Delete(usize),
    /// After the next `skip` evictions, `refuse` are refused (the budget "is still being
    /// processed").
    Flaky {
        skip: u8,
        refuse: u8,
    },
    /// A budget over tier `tier` keeping `min` pods running.
    Budget {
        tier: u8,
        min: u32,
    },
    LeaderChange,
    /// Time passes.
    Wait(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..4usize, prop::sample::select(vec![1u32, 2, 4, 8]), prop::sample::select(vec![1u32, 1, 1, 2, 3]),
              prop::bool::weighted(0.1), prop::sample::select(vec![5i64, 30, 120]),
              prop::bool::weighted(0.2), 0..3u8)
            .prop_map(|(priority, gpus, members, never, grace, ignores_sigterm, tier)| Op::Arrive {
                priority,
                gpus: if members > 1 { gpus.min(4) } else { gpus },
                members,
                never,
                grace,
                ignores_sigterm,
                tier,
            }),
        1 => (0..16usize).prop_map(Op::Finish),
        1 => (0..8usize).prop_map(Op::Delete),
        1 => (0..3u8, 1..3u8).prop_map(|(skip, refuse)| Op::Flaky { skip, refuse }),
        1 => (0..3u8, 0..4u32).prop_map(|(tier, min)| Op::Budget { tier, min }),
        1 => Just(Op::LeaderChange),
        2 => (1..200i64).prop_map(Op::Wait),
    ]
}

/// The test's side of the world: the kubelet (when terminating pods go) and the injected
/// refusals.
#[derive(Default)]
struct World {
    /// Pod UID → whether it ignores SIGTERM (then it stops only when its grace period ends).
    ignores: HashMap<String, bool>,
    /// Evictions to let through before refusing.
    skip: u8,
    /// Evictions to refuse then.
    flaky: u8,
    injected: usize,
    names: usize,
    budgets: BTreeSet<u8>,
}

impl World {
    fn arrive(&mut self, model: &mut ClusterModel, op: &Op) {
        let Op::Arrive {
            priority,
            gpus,
            members,
            never,
            grace,
            ignores_sigterm,
            tier,
        } = op
        else {
            return;
        };
        self.names += 1;
        let gang = format!("g{}", self.names);
        for m in 0..*members {
            let mut t = PodTemplate::new(
                &format!("p{}-{m}", self.names),
                PRIORITIES[*priority],
                *gpus,
            );
            t.never_preempts = *never;
            t.grace_seconds = *grace;
            t.labels.insert("tier".into(), tier.to_string());
            if *members > 1 {
                t.group = Some((gang.clone(), *members));
            }
            let uid = model.create(&t);
            self.ignores.insert(uid, *ignores_sigterm);
        }
    }

    /// Removes the terminating pods whose time has come: 2 s after the eviction, or at the end
    /// of the grace period for a pod that ignores SIGTERM.
    fn kubelet(&self, model: &mut ClusterModel) {
        let now = model.now;
        let gone: Vec<String> = model
            .pods()
            .filter_map(|p| {
                let since = p.metadata.deletion_timestamp.as_ref()?.0;
                let uid = p.metadata.uid.clone()?;
                let grace = p
                    .spec
                    .as_ref()?
                    .termination_grace_period_seconds
                    .unwrap_or(30);
                let takes = if self.ignores.get(&uid).copied().unwrap_or(false) {
                    grace
                } else {
                    2
                };
                (now.duration_since(since) >= SignedDuration::from_secs(takes)).then_some(uid)
            })
            .collect();
        for uid in gone {
            model.remove(&uid);
        }
    }

    fn finish(model: &mut ClusterModel, n: usize) {
        let running: Vec<String> = model
            .pods()
            .filter(|p| is_running(p) && p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let Some(uid) = running.get(n % running.len().max(1)).cloned() else {
            return;
        };
        let key = model.pod(&uid).and_then(group_key);
        let whole: Vec<String> = model
            .pods()
            .filter(|p| key.is_some() && group_key(p) == key)
            .filter_map(|p| p.metadata.uid.clone())
            .chain([uid])
            .collect();
        for uid in whole {
            model.remove(&uid);
        }
    }

    fn delete(model: &mut ClusterModel, n: usize) {
        let gated = model.gated();
        if let Some(uid) = gated.get(n % gated.len().max(1)) {
            model.remove(uid);
        }
    }
}

/// One step of the controller with the injected refusals.
fn step(
    world: &mut World,
    ctl: &mut ControllerModel,
    model: &mut ClusterModel,
) -> Result<(), TestCaseError> {
    let (mut skip, mut flaky) = (world.skip, world.flaky);
    let mut injected = 0;
    let result = ctl.step(model, &mut |m: &mut ClusterModel, uid: &str| {
        if skip > 0 {
            skip -= 1;
        } else if flaky > 0 {
            flaky -= 1;
            injected += 1;
            return Err(Refusal::Budget("injected".into()));
        }
        m.evict(uid)
    });
    (world.skip, world.flaky) = (skip, flaky);
    world.injected += injected;
    prop_assert!(result.is_ok(), "{result:?}");
    let checked = check_after_step(ctl, model);
    if checked.is_err() && std::env::var("TRACE_DEBUG").is_ok() {
        dump(ctl);
    }
    checked
}

fn dump(ctl: &ControllerModel) {
    for e in &ctl.events {
        match e {
            Event::Preempted {
                preemptors, plan, ..
            } => eprintln!(
                "PLAN {preemptors:?} victims {:?}",
                plan.victims
                    .iter()
                    .map(|v| (&v.uid, &v.group))
                    .collect::<Vec<_>>()
            ),
            other => eprintln!("{other:?}"),
        }
    }
}

/// The invariants that hold after every step.
fn check_after_step(ctl: &ControllerModel, model: &ClusterModel) -> Result<(), TestCaseError> {
    // No device held by two claims.
    let mut held = BTreeSet::new();
    for claim in model.claims() {
        for r in claim
            .status
            .iter()
            .flat_map(|s| s.allocation.iter())
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        {
            prop_assert!(
                held.insert((r.pool.clone(), r.device.clone())),
                "{}/{} twice",
                r.pool,
                r.device
            );
        }
    }
    let mut attempted: BTreeSet<&str> = BTreeSet::new();
    for event in &ctl.events {
        match event {
            Event::Preempted { priority, plan, .. } => {
                for v in &plan.victims {
                    prop_assert!(
                        v.priority < *priority,
                        "victim {} ({}) for priority {priority}",
                        v.pod,
                        v.priority
                    );
                }
            }
            // A plan's evictions fit the budgets when it is made: only a retry (a gang pod whose
            // eviction is committed, a budget created or changed since) may be refused.
            Event::Refused { refusal, pod } => {
                prop_assert!(
                    matches!(refusal, Refusal::Budget(b) if b == "injected")
                        || *refusal == Refusal::Gone
                        || attempted.contains(pod.as_str()),
                    "eviction of {pod} refused at the first attempt: {refusal:?}"
                );
                attempted.insert(pod);
            }
            Event::Evicted { pod } => {
                attempted.insert(pod);
            }
            _ => {}
        }
    }
    Ok(())
}

/// A plan takes a victim gang whole: after the step, no pod of a victim's gang (as the pods say,
/// not as the plan says) runs on outside the plan. Records the gangs of the pods evicted.
fn check_plans(
    events: &[Event],
    model: &ClusterModel,
    victim_gangs: &mut BTreeSet<String>,
) -> Result<(), TestCaseError> {
    for event in events {
        if let Event::Evicted { pod } = event
            && let Some(key) = model.pod(pod).and_then(group_key)
        {
            victim_gangs.insert(key.to_string());
        }
        let Event::Preempted { plan, .. } = event else {
            continue;
        };
        let planned: BTreeSet<&str> = plan.victims.iter().map(|v| v.uid.as_str()).collect();
        let groups: BTreeSet<String> = plan
            .victims
            .iter()
            .filter_map(|v| model.pod(&v.uid).and_then(group_key))
            .map(|k| k.to_string())
            .collect();
        for pod in model.pods() {
            let Some(key) = group_key(pod) else { continue };
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if groups.contains(&key.to_string()) && is_running(pod) {
                prop_assert!(
                    planned.contains(uid),
                    "{key}: {uid} runs on outside the plan"
                );
            }
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut model = cluster(3, 2);
    let mut ctl = controller(true);
    let mut world = World::default();
    let mut victim_gangs = BTreeSet::new();
    for op in &ops {
        match op {
            Op::Arrive { .. } => world.arrive(&mut model, op),
            Op::Finish(n) => World::finish(&mut model, *n),
            Op::Delete(n) => World::delete(&mut model, *n),
            Op::Flaky { skip, refuse } => (world.skip, world.flaky) = (*skip, *refuse),
            Op::Budget { tier, min } => {
                if world.budgets.insert(*tier) {
                    model.add_budget(BudgetTemplate {
                        name: format!("tier-{tier}"),
                        labels: BTreeMap::from([("tier".to_owned(), tier.to_string())]),
                        min_available: *min,
                    });
                }
            }
            Op::LeaderChange => ctl.change_leader(),
            Op::Wait(s) => advance(&mut model, *s),
        }
        world.kubelet(&mut model);
        let before = ctl.events.len();
        step(&mut world, &mut ctl, &mut model)?;
        record_gang_placements(&ctl.events[before..], &model)?;
        check_plans(&ctl.events[before..], &model, &mut victim_gangs)?;
        advance(&mut model, 5);
    }
    drain(&mut world, &mut ctl, &mut model)?;
    let end = check_end(&ctl, &model, &victim_gangs);
    if end.is_err() && std::env::var("TRACE_DEBUG").is_ok() {
        for e in &ctl.events {
            match e {
                Event::Preempted {
                    preemptors, plan, ..
                } => eprintln!(
                    "PLAN {preemptors:?} victims {:?}",
                    plan.victims
                        .iter()
                        .map(|v| (&v.uid, &v.group))
                        .collect::<Vec<_>>()
                ),
                other => eprintln!("{other:?}"),
            }
        }
    }
    end
}

fn advance(model: &mut ClusterModel, seconds: i64) {
    model.now = model
        .now
        .saturating_add(SignedDuration::from_secs(seconds))
        .unwrap_or(model.now);
}

/// A gang's pods are placed in one decision, at least minCount of them.
fn record_gang_placements(events: &[Event], model: &ClusterModel) -> Result<(), TestCaseError> {
    for event in events {
        let Event::Placed { pods } = event else {
            continue;
        };
        let mut per_gang: BTreeMap<String, u32> = BTreeMap::new();
        for (uid, _) in pods {
            if let Some(key) = model.pod(uid).and_then(group_key) {
                *per_gang.entry(key.to_string()).or_default() += 1;
            }
        }
        for (gang, n) in per_gang {
            let min = model
                .pods()
                .filter(|p| group_key(p).is_some_and(|k| k.to_string() == gang))
                .filter_map(|p| {
                    p.metadata
                        .annotations
                        .as_ref()?
                        .get(tessera_api::names::GROUP_MIN_COUNT_ANNOTATION)?
                        .parse::<u32>()
                        .ok()
                })
                .next()
                .unwrap_or(1);
            prop_assert!(n >= min, "{gang}: {n} placed at once, minCount {min}");
        }
    }
    Ok(())
}

/// No arrivals any more: time passes until every terminating pod is gone and every nomination
/// has lapsed or been used.
fn drain(
    world: &mut World,
    ctl: &mut ControllerModel,
    model: &mut ClusterModel,
) -> Result<(), TestCaseError> {
    (world.skip, world.flaky) = (0, 0);
    for _ in 0..12 {
        advance(model, 60);
        world.kubelet(model);
        step(world, ctl, model)?;
    }
    Ok(())
}

fn check_end(
    ctl: &ControllerModel,
    model: &ClusterModel,
    victim_gangs: &BTreeSet<String>,
) -> Result<(), TestCaseError> {
    for pod in model.pods() {
        prop_assert!(
            Nomination::of(pod).is_none(),
            "{:?} still nominated",
            pod.metadata.name
        );
        prop_assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "{:?} still terminating",
            pod.metadata.name
        );
    }
    // No gang with a pod evicted and another still running — unless that pod is marked (its
    // eviction committed, retried every pass) and a budget created or changed since refuses it.
    let mut last_refusal: BTreeMap<&str, &Refusal> = BTreeMap::new();
    for event in &ctl.events {
        if let Event::Refused { pod, refusal } = event {
            last_refusal.insert(pod, refusal);
        }
    }
    for pod in model.pods() {
        if let Some(key) = group_key(pod) {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let held = PreemptedBy::is_marked(pod)
                && matches!(last_refusal.get(uid), Some(Refusal::Budget(b)) if b != "injected");
            prop_assert!(
                !(victim_gangs.contains(&key.to_string()) && is_running(pod)) || held,
                "{key}: a pod still runs after others were evicted"
            );
        }
    }
    // Every preemptor still waiting had its nomination released.
    let released: BTreeSet<&str> = ctl
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Released { pod } => Some(pod.as_str()),
            _ => None,
        })
        .collect();
    for event in &ctl.events {
        if let Event::Preempted { plan, .. } = event {
            for r in &plan.reservations {
                if let Some(pod) = model.pod(&r.uid).filter(|p| !is_running(p)) {
                    prop_assert!(
                        released.contains(r.uid.as_str()),
                        "{} (priority {}) neither placed nor released",
                        r.pod,
                        pod_priority(pod)
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn preemption_keeps_its_invariants_over_random_traces(ops in prop::collection::vec(op(), 1..64)) {
        run(ops)?;
    }
}

#[test]
fn a_hand_written_trace_preempts_completes_and_survives_a_leader_change() {
    let ops = vec![
        Op::Arrive {
            priority: 0,
            gpus: 8,
            members: 1,
            never: false,
            grace: 30,
            ignores_sigterm: true,
            tier: 0,
        },
        Op::Arrive {
            priority: 0,
            gpus: 8,
            members: 1,
            never: false,
            grace: 30,
            ignores_sigterm: false,
            tier: 0,
        },
        Op::Arrive {
            priority: 0,
            gpus: 4,
            members: 2,
            never: false,
            grace: 30,
            ignores_sigterm: false,
            tier: 1,
        },
        Op::Arrive {
            priority: 1,
            gpus: 8,
            members: 1,
            never: false,
            grace: 30,
            ignores_sigterm: false,
            tier: 1,
        },
        Op::Arrive {
            priority: 3,
            gpus: 8,
            members: 2,
            never: false,
            grace: 30,
            ignores_sigterm: false,
            tier: 2,
        },
        Op::LeaderChange,
        Op::Wait(10),
        Op::Arrive {
            priority: 3,
            gpus: 4,
            members: 1,
            never: false,
            grace: 30,
            ignores_sigterm: false,
            tier: 2,
        },
    ];
    run(ops).unwrap();
}
