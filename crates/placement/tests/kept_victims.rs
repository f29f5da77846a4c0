//! The victim index kept change by change ([`KeptVictims`]) equals a fresh build of the same
//! objects ([`victim_index`], what [`Victims::new`] reads) after every step of random change
//! sequences (seeded): pods started alone or as gangs, pods finished, evicted (terminating),
//! marked as victims, nominations written and withdrawn, budgets added and recounted. And a
//! change rebuilds only the units it touches (counted).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_api::names::{PREEMPTED_BY_ANNOTATION, TOPOLOGY_AWARE_GATE};
use tessera_placement::preemption::nomination::{NominatedVictim, Nomination};
use tessera_placement::preemption::{KeptVictims, ManagedDevices, Victims, victim_index};
use tessera_placement::protocol::object_key;
use tessera_placement::simulation::{BudgetTemplate, ClusterModel, PodTemplate};

use support::cluster;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// An index in an order-free form: each live unit with its pods, claims and budgets by name;
/// each node's units; the budgets' allowances.
fn canonical(v: &Victims) -> Vec<String> {
    let unit_name = |u: usize| {
        let mut pods: Vec<&str> = v.units[u]
            .pods
            .iter()
            .map(|&p| v.pods[p].key.as_str())
            .collect();
        pods.sort_unstable();
        pods.join("+")
    };
    let mut lines = Vec::new();
    for (u, unit) in v.units.iter().enumerate().filter(|(_, u)| !u.is_gone()) {
        let mut pods: Vec<String> = unit
            .pods
            .iter()
            .map(|&p| {
                let pod = &v.pods[p];
                let budgets: Vec<&str> = pod.budgets.iter().map(|&b| v.budgets.name(b)).collect();
                let mut claims: Vec<String> = pod
                    .claims
                    .iter()
                    .map(|&c| object_key(&v.claims[c].claim.metadata))
                    .collect();
                claims.sort();
                format!(
                    "{} {} prio={} node={} {:?} work={} grace={} budgets={budgets:?} claims={claims:?}",
                    pod.key, pod.uid, pod.priority, pod.node, pod.requests, pod.gpu_seconds,
                    pod.grace_seconds
                )
            })
            .collect();
        pods.sort();
        let mut claims: Vec<String> = unit
            .claims
            .iter()
            .map(|&c| {
                let claim = &v.claims[c];
                let mut units: Vec<String> = claim.units.iter().map(|&u| unit_name(u)).collect();
                units.sort();
                format!(
                    "{} {:?} {units:?}",
                    object_key(&claim.claim.metadata),
                    claim.devices
                )
            })
            .collect();
        claims.sort();
        let budgets: BTreeMap<&str, u32> = unit
            .budgets
            .iter()
            .map(|(&b, &n)| (v.budgets.name(b), n))
            .collect();
        lines.push(format!(
            "unit {:?} prio={} work={} blocked={:?} budgets={budgets:?} pods={pods:?} claims={claims:?}",
            unit.group, unit.priority, unit.gpu_seconds, unit.blocked
        ));
        let _ = u;
    }
    for (node, units) in &v.by_node {
        for &(u, n) in units {
            lines.push(format!("node {node}: {} holds {n}", unit_name(u)));
        }
    }
    let mut b = 0;
    while !v.budgets.name(b).is_empty() {
        lines.push(format!(
            "budget {} allows {}",
            v.budgets.name(b),
            v.budgets.allowed(b)
        ));
        b += 1;
    }
    lines.sort();
    lines
}

/// The model's objects as a controller's caches hold them.
struct Objects {
    pods: HashMap<String, Arc<Pod>>,
    claims: HashMap<String, Arc<ResourceClaim>>,
    budgets: Vec<Arc<PodDisruptionBudget>>,
}

impl Objects {
    fn of(model: &ClusterModel) -> Objects {
        Objects {
            pods: model
                .pods()
                .map(|p| (object_key(&p.metadata), Arc::new(p.clone())))
                .collect(),
            claims: model
                .claims()
                .map(|c| (object_key(&c.metadata), c.clone()))
                .collect(),
            budgets: model.budgets().cloned().map(Arc::new).collect(),
        }
    }

    fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.values().cloned().collect()
    }

    fn claims(&self) -> Vec<Arc<ResourceClaim>> {
        self.claims.values().cloned().collect()
    }
}

/// Applies to `kept` what changed from `old` to `new`, as the controller's watches report it.
fn apply(
    kept: &mut KeptVictims,
    devices: &ManagedDevices,
    old: &Objects,
    new: &Objects,
    model: &ClusterModel,
) {
    let now = model.now;
    for (key, pod) in &new.pods {
        if old.pods.get(key) != Some(pod) {
            kept.set_pod(devices, key, Some(pod.clone()), now);
        }
    }
    for key in old.pods.keys().filter(|k| !new.pods.contains_key(*k)) {
        kept.set_pod(devices, key, None, now);
    }
    for (key, claim) in &new.claims {
        if old.claims.get(key) != Some(claim) {
            kept.set_claim(devices, key, Some(claim.clone()), now);
        }
    }
    for key in old.claims.keys().filter(|k| !new.claims.contains_key(*k)) {
        kept.set_claim(devices, key, None, now);
    }
    if old.budgets != new.budgets {
        kept.set_budgets(&new.budgets);
    }
}

const NODES: usize = 4;
const GPUS: usize = 8;

/// The free GPUs of `node` (names), lowest first.
fn free_gpus(model: &ClusterModel, node: usize) -> Vec<String> {
    let in_use = model.in_use();
    let name = format!("dgx-{node:03}");
    (0..GPUS)
        .map(|g| format!("gpu-{g}"))
        .filter(|g| {
            !model
                .snapshot
                .managed
                .node_devices(&name)
                .any(|(id, _)| id.device() == g && in_use.is_in_use(id))
        })
        .collect()
}

/// One random change of `model`; `n` names new objects.
fn change(model: &mut ClusterModel, rng: &mut Rng, n: usize) {
    let running: Vec<String> = model
        .pods()
        .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let pick = |rng: &mut Rng| running.get(rng.below(running.len())).cloned();
    match rng.below(10) {
        0..=2 => start(model, rng, n),
        3 => {
            if let Some(uid) = pick(rng) {
                model.remove(&uid);
            }
        }
        4 => {
            if let Some(uid) = pick(rng) {
                let _ = model.evict(&uid);
            }
        }
        5 => {
            if let Some(uid) = pick(rng) {
                model.annotate(&uid, PREEMPTED_BY_ANNOTATION, Some("{}".to_owned()));
            }
        }
        6 => nominate(model, rng, &running, n),
        7 => {
            let nominated: Vec<String> = model.gated();
            if let Some(uid) = nominated.get(rng.below(nominated.len())) {
                model.set_nomination(uid, None);
            }
        }
        8 => model.refresh_budgets(),
        _ => model.add_budget(BudgetTemplate {
            name: format!("budget-{n}"),
            labels: [("team".to_owned(), format!("t{}", rng.below(3)))].into(),
            min_available: rng.below(3) as u32,
        }),
    }
}

/// Starts a pod (or a 2-pod gang) on free GPUs.
fn start(model: &mut ClusterModel, rng: &mut Rng, n: usize) {
    let members = if rng.below(4) == 0 { 2 } else { 1 };
    let gpus = [1, 2, 4][rng.below(3)];
    for m in 0..members {
        let node = rng.below(NODES);
        let free = free_gpus(model, node);
        if free.len() < gpus {
            return;
        }
        let mut t = PodTemplate::new(
            &format!("p{n}-{m}"),
            [-10, 0, 100][rng.below(3)],
            gpus as u32,
        );
        t.labels = [("team".to_owned(), format!("t{}", rng.below(3)))].into();
        if members > 1 {
            t.group = Some((format!("g{n}"), 2));
        }
        let devices = free[..gpus].to_vec();
        model
            .run_placed(&t, &format!("dgx-{node:03}"), &devices)
            .expect("free devices");
    }
}

/// Creates a gated pod nominated to take some running pods' place.
fn nominate(model: &mut ClusterModel, rng: &mut Rng, running: &[String], n: usize) {
    let uid = model.create(&PodTemplate::new(&format!("preemptor-{n}"), 1000, 1));
    let victims = (0..rng.below(3))
        .filter_map(|_| running.get(rng.below(running.len())))
        .filter_map(|v| model.pod(v))
        .map(|v| NominatedVictim {
            pod: object_key(&v.metadata),
            uid: v.metadata.uid.clone().unwrap_or_default(),
            group: None,
        })
        .collect();
    let nomination = Nomination {
        node: "dgx-000".to_owned(),
        devices: Vec::new(),
        victims,
        at: model.now.to_string(),
        expires: model
            .now
            .saturating_add(k8s_openapi::jiff::SignedDuration::from_secs(600))
            .unwrap()
            .to_string(),
    };
    model.set_nomination(&uid, Some(&nomination));
}

fn run_sequence(seed: u64, steps: usize) {
    let mut model = cluster(NODES, 2);
    let devices = ManagedDevices::new(&model.snapshot);
    let mut rng = Rng(seed);
    let mut objects = Objects::of(&model);
    let mut kept = KeptVictims::new(&devices, &[], &[], &[], TOPOLOGY_AWARE_GATE, model.now);
    for step in 0..steps {
        change(&mut model, &mut rng, step);
        let now = Objects::of(&model);
        apply(&mut kept, &devices, &objects, &now, &model);
        objects = now;
        let fresh = victim_index(
            &devices,
            &objects.pods(),
            &objects.claims(),
            &objects.budgets,
            TOPOLOGY_AWARE_GATE,
            model.now,
        );
        assert_eq!(
            canonical(&kept.victims()),
            canonical(&fresh),
            "seed {seed}, step {step}: the kept index equals a fresh build"
        );
    }
    let work = kept.work();
    assert!(work.changes > 0, "seed {seed}: changes were applied");
    // Each change rebuilds the units of the pods it names and of those tied to them (a gang of 2,
    // a nomination's few victims): a handful of pods, never the whole index.
    assert!(
        work.pods_rebuilt <= 4 * work.changes,
        "seed {seed}: {} pods rebuilt for {} changes",
        work.pods_rebuilt,
        work.changes
    );
}

#[test]
fn the_kept_victim_index_equals_a_fresh_build_after_random_changes() {
    for seed in [1, 2, 3, 4] {
        run_sequence(seed, 150);
    }
}
