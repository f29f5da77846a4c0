//! The parity job's judgement of one instance from three verdicts: Tessera's, upstream's and the
//! reference allocator's (crate::reference).
//!
//! - Upstream answered on every node: the reference must equal upstream (that is what makes the
//!   reference worth trusting where upstream did not answer), and Tessera must equal upstream,
//!   unless a documented deviation explains the difference: Tessera's verdict on the instance
//!   must then equal upstream's on the instance with the deviation taken out, and taking it out
//!   must change nothing but the deviation's own fields.
//! - Upstream's Filter timed out on some node: allowed only on an instance generated as
//!   adversarial (an ordinary instance that times out fails the job); the reference must equal
//!   upstream on the nodes upstream answered, and Tessera must equal the reference everywhere.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::compare::{Difference, compare, compare_node};
use crate::generate::Switches;
use crate::instance::{Instance, Verdict, VerdictKind};

/// Why an instance fails the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParityFailure {
    /// Tessera differs from upstream and no enabled deviation explains it.
    OursDiffersFromUpstream,
    /// The reference differs from upstream where upstream answered.
    ReferenceDiffersFromUpstream,
    /// Upstream timed out; Tessera differs from the reference.
    OursDiffersFromReference,
    /// Upstream timed out on an instance not generated as adversarial.
    OrdinaryTimeout,
    /// Taking a deviation out of the instance changed more than the deviation's fields.
    DeviationBeyondItsFields,
}

impl std::fmt::Display for ParityFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParityFailure::OursDiffersFromUpstream => "Tessera differs from upstream",
            ParityFailure::ReferenceDiffersFromUpstream => "the reference differs from upstream",
            ParityFailure::OursDiffersFromReference => {
                "upstream timed out and Tessera differs from the reference"
            }
            ParityFailure::OrdinaryTimeout => {
                "upstream timed out on an instance not generated as adversarial"
            }
            ParityFailure::DeviationBeyondItsFields => {
                "taking the deviation out changed more than its own fields"
            }
        })
    }
}

/// The judgement of one instance.
#[derive(Clone, Debug, PartialEq)]
pub enum Judgement {
    /// Tessera, upstream and the reference agree.
    Agrees,
    /// Upstream timed out on an adversarial instance; Tessera equals the reference.
    DecidedPastUpstreamTimeout,
    /// Tessera differs from upstream as this documented deviation says it does.
    Explained(&'static str),
    /// The instance fails the job.
    Fails(Vec<(ParityFailure, Vec<Difference>)>),
}

/// Whether upstream's Filter timed out on some node.
pub fn upstream_timed_out(upstream: &Verdict) -> bool {
    upstream
        .nodes
        .iter()
        .any(|n| n.error_class.as_deref() == Some("timeout"))
}

/// Judges an instance. `upstream_on` decides an instance with upstream (for the instance with a
/// deviation taken out); `enabled` are the deviations the generator may exercise.
pub fn judge(
    instance: &Instance,
    ours: &Verdict,
    upstream: &Verdict,
    reference: &Verdict,
    enabled: &[&'static str],
    upstream_on: &mut dyn FnMut(&Instance) -> anyhow::Result<Verdict>,
) -> anyhow::Result<Judgement> {
    if upstream_timed_out(upstream) {
        let failures = past_upstream_timeout(instance, ours, upstream, reference);
        return Ok(if failures.is_empty() {
            Judgement::DecidedPastUpstreamTimeout
        } else {
            Judgement::Fails(failures)
        });
    }
    let mut failures = Vec::new();
    let reference_differs = compare(reference, upstream);
    if !reference_differs.is_empty() {
        failures.push((
            ParityFailure::ReferenceDiffersFromUpstream,
            between(reference_differs, "reference", "upstream"),
        ));
    }
    let differs = compare(ours, upstream);
    let mut explained = None;
    if !differs.is_empty() {
        for &deviation in enabled {
            let mut stripped = instance.clone();
            Switches::disable(deviation, &mut stripped);
            if stripped == *instance {
                continue;
            }
            let beyond = changes_beyond(deviation, instance, &stripped);
            if !beyond.is_empty() {
                failures.push((ParityFailure::DeviationBeyondItsFields, beyond));
                continue;
            }
            if compare(ours, &upstream_on(&stripped)?).is_empty() {
                explained = Some(deviation);
                break;
            }
        }
        if explained.is_none() {
            failures.push((ParityFailure::OursDiffersFromUpstream, differs));
        }
    }
    Ok(match (failures.is_empty(), explained) {
        (false, _) => Judgement::Fails(failures),
        (true, Some(d)) => Judgement::Explained(d),
        (true, None) => Judgement::Agrees,
    })
}

/// The failures of an instance on which upstream timed out somewhere: the instance must be
/// adversarial, the reference must equal upstream on every node upstream answered, and Tessera
/// must equal the reference.
fn past_upstream_timeout(
    instance: &Instance,
    ours: &Verdict,
    upstream: &Verdict,
    reference: &Verdict,
) -> Vec<(ParityFailure, Vec<Difference>)> {
    let mut failures = Vec::new();
    if !instance.adversarial {
        let nodes = upstream
            .nodes
            .iter()
            .filter(|n| n.error_class.as_deref() == Some("timeout"))
            .map(|n| Difference::new(format!("node {}", n.node), "-", "timeout"))
            .collect();
        failures.push((ParityFailure::OrdinaryTimeout, nodes));
    }
    let answered = upstream
        .nodes
        .iter()
        .filter(|n| n.error_class.as_deref() != Some("timeout"));
    let mut reference_differs = Vec::new();
    for u in answered {
        match reference.nodes.iter().find(|r| r.node == u.node) {
            Some(r) => reference_differs.extend(compare_node(r, u)),
            None => reference_differs.push(Difference::new(
                format!("node {}", u.node),
                "not evaluated",
                u.outcome.to_string(),
            )),
        }
    }
    if !reference_differs.is_empty() {
        failures.push((
            ParityFailure::ReferenceDiffersFromUpstream,
            between(reference_differs, "reference", "upstream"),
        ));
    }
    let differs = compare(ours, reference);
    if !differs.is_empty() {
        failures.push((
            ParityFailure::OursDiffersFromReference,
            between(differs, "ours", "reference"),
        ));
    }
    failures
}

/// The fields of a deviation: what taking it out may change (JSON pointers, `*` for an index).
fn deviation_fields(deviation: &str) -> &'static [&'static str] {
    match deviation {
        "shared-non-multi" => &[
            "/allocatedClaims/*/status/allocation/devices/results/*/shareID",
            "/allocatedClaims/*/status/allocation/devices/results/*/consumedCapacity",
        ],
        _ => &[],
    }
}

/// What taking `deviation` out changed outside the deviation's fields.
pub fn changes_beyond(deviation: &str, before: &Instance, after: &Instance) -> Vec<Difference> {
    let (a, b) = (
        serde_json::to_value(before).unwrap_or(Value::Null),
        serde_json::to_value(after).unwrap_or(Value::Null),
    );
    let mut changed = Vec::new();
    changed_paths("", &a, &b, &mut changed);
    let allowed = deviation_fields(deviation);
    changed
        .into_iter()
        .filter(|path| !allowed.iter().any(|pattern| path_matches(pattern, path)))
        .map(|path| {
            Difference::new(format!("instance field {path}"), "changed", "changed")
                .between("original", "stripped")
        })
        .collect()
}

fn between(
    differences: Vec<Difference>,
    left: &'static str,
    right: &'static str,
) -> Vec<Difference> {
    differences
        .into_iter()
        .map(|d| d.between(left, right))
        .collect()
}

/// JSON pointers of the values that differ (the deepest point where they do).
fn changed_paths(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                changed_paths(&format!("{at}/{k}"), va, vb, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                changed_paths(&format!("{at}/{i}"), va, vb, out);
            }
        }
        _ if a != b => out.push(at.to_owned()),
        _ => {}
    }
}

fn path_matches(pattern: &str, path: &str) -> bool {
    let (p, q): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), path.split('/').collect());
    p.len() == q.len()
        && p.iter()
            .zip(&q)
            .all(|(a, b)| *a == *b || (*a == "*" && b.parse::<usize>().is_ok()))
}

/// How often the decided verdicts (upstream's, or the reference's where upstream timed out)
/// reached each outcome and feature, with the least each must reach per thousand instances.
#[derive(Debug, Default)]
pub struct Coverage {
    pub counts: BTreeMap<&'static str, u64>,
}

/// Per outcome or feature: the fewest per thousand instances the job accepts (about half of
/// what seeds 1–8 reach with every deviation on).
pub const LEAST_PER_THOUSAND: &[(&str, u64)] = &[
    ("allocated", 100),
    ("unsatisfiable", 250),
    ("error", 40),
    ("shared", 8),
    ("admin", 4),
    ("counters", 8),
    ("prioritized-list", 25),
];

/// With every deviation on: the fewest adversarial instances decided past upstream's timeout
/// per thousand instances.
pub const LEAST_TIMEOUTS_PER_THOUSAND: u64 = 2;

impl Coverage {
    /// Counts one instance's decided verdict.
    pub fn record(&mut self, instance: &Instance, decided: &Verdict, past_timeout: bool) {
        let mut count = |k: &'static str| *self.counts.entry(k).or_default() += 1;
        count(match decided.outcome {
            VerdictKind::Allocated => "allocated",
            VerdictKind::Unsatisfiable => "unsatisfiable",
            VerdictKind::Error => "error",
        });
        if past_timeout {
            count("upstream-timeout");
        }
        let results: Vec<_> = decided
            .allocations
            .iter()
            .filter_map(|a| a.devices.as_ref()?.results.as_ref())
            .flatten()
            .collect();
        if results.iter().any(|r| r.share_id.is_some()) {
            count("shared");
        }
        if results.iter().any(|r| r.admin_access == Some(true)) {
            count("admin");
        }
        if results.iter().any(|r| r.request.contains('/')) {
            count("prioritized-list");
        }
        let consumes_counters = results.iter().any(|r| {
            instance.slices.iter().any(|s| {
                s.spec.driver == r.driver
                    && s.spec.pool.name == r.pool
                    && s.spec.devices.iter().flatten().any(|d| {
                        d.name == r.device
                            && d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
                    })
            })
        });
        if consumes_counters {
            count("counters");
        }
    }

    /// Every outcome or feature below its least for `instances` instances: (name, reached,
    /// least).
    pub fn shortfalls(
        &self,
        instances: u64,
        timeouts_expected: bool,
    ) -> Vec<(&'static str, u64, u64)> {
        let mut least: Vec<(&str, u64)> = LEAST_PER_THOUSAND.to_vec();
        if timeouts_expected {
            least.push(("upstream-timeout", LEAST_TIMEOUTS_PER_THOUSAND));
        }
        least
            .into_iter()
            .map(|(k, per)| {
                (
                    k,
                    self.counts.get(k).copied().unwrap_or(0),
                    per * instances / 1000,
                )
            })
            .filter(|(_, reached, least)| reached < least)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{
        AllocationResult, Device, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaim, ResourceClaimStatus, ResourceSlice,
    };

    use super::*;
    use crate::instance::NodeVerdict;

    fn node(
        name: &str,
        outcome: VerdictKind,
        class: Option<&str>,
        devices: &[&str],
    ) -> NodeVerdict {
        NodeVerdict {
            node: name.into(),
            outcome,
            error_class: class.map(Into::into),
            message: None,
            allocations: if devices.is_empty() {
                Vec::new()
            } else {
                vec![allocation(devices)]
            },
            micros: 0,
        }
    }

    fn allocation(devices: &[&str]) -> AllocationResult {
        AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    devices
                        .iter()
                        .map(|d| DeviceRequestAllocationResult {
                            request: "req-0".into(),
                            driver: "driver-a".into(),
                            pool: "pool".into(),
                            device: (*d).into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                config: None,
            }),
            ..Default::default()
        }
    }

    /// The pod's verdict from its nodes, as the scheduler forms it.
    fn pod(nodes: Vec<NodeVerdict>) -> Verdict {
        let mut v = Verdict {
            name: "case".into(),
            outcome: VerdictKind::Unsatisfiable,
            node: None,
            allocations: Vec::new(),
            error_class: None,
            message: None,
            stage: None,
            nodes,
        };
        if let Some(e) = v.nodes.iter().find(|n| n.outcome == VerdictKind::Error) {
            v.outcome = VerdictKind::Error;
            v.error_class = e.error_class.clone();
            v.node = Some(e.node.clone());
        } else if let Some(a) = v.nodes.iter().find(|n| n.outcome == VerdictKind::Allocated) {
            v.outcome = VerdictKind::Allocated;
            v.node = Some(a.node.clone());
            v.allocations = a.allocations.clone();
        }
        v
    }

    fn fits(devices: &[&str]) -> Verdict {
        pod(vec![node("node-1", VerdictKind::Allocated, None, devices)])
    }

    fn timed_out() -> Verdict {
        pod(vec![node(
            "node-1",
            VerdictKind::Error,
            Some("timeout"),
            &[],
        )])
    }

    fn no_upstream_needed(_: &Instance) -> anyhow::Result<Verdict> {
        anyhow::bail!("upstream is not asked again here")
    }

    fn judge_plain(
        instance: &Instance,
        ours: &Verdict,
        upstream: &Verdict,
        reference: &Verdict,
    ) -> Judgement {
        judge(
            instance,
            ours,
            upstream,
            reference,
            &[],
            &mut no_upstream_needed,
        )
        .unwrap()
    }

    fn failures(j: &Judgement) -> Vec<ParityFailure> {
        match j {
            Judgement::Fails(f) => f.iter().map(|(f, _)| *f).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn three_equal_verdicts_agree_and_any_one_differing_fails() {
        let i = Instance::default();
        let (a, b) = (fits(&["dev-0"]), fits(&["dev-1"]));
        assert_eq!(
            judge_plain(&i, &a, &a.clone(), &a.clone()),
            Judgement::Agrees
        );
        assert_eq!(
            failures(&judge_plain(&i, &b, &a, &a)),
            [ParityFailure::OursDiffersFromUpstream]
        );
        assert_eq!(
            failures(&judge_plain(&i, &a, &a, &b)),
            [ParityFailure::ReferenceDiffersFromUpstream]
        );
    }

    #[test]
    fn an_ordinary_instance_may_not_time_out_upstream() {
        let i = Instance::default();
        let answer = fits(&["dev-0"]);
        let j = judge_plain(&i, &answer, &timed_out(), &answer.clone());
        assert_eq!(failures(&j), [ParityFailure::OrdinaryTimeout]);
    }

    #[test]
    fn where_upstream_timed_out_tessera_must_equal_the_reference() {
        let i = Instance {
            adversarial: true,
            ..Default::default()
        };
        let answer = fits(&["dev-1", "dev-0"]);
        assert_eq!(
            judge_plain(&i, &answer, &timed_out(), &answer.clone()),
            Judgement::DecidedPastUpstreamTimeout
        );
        let wrong = fits(&["dev-0", "dev-1"]);
        let j = judge_plain(&i, &wrong, &timed_out(), &answer);
        assert_eq!(failures(&j), [ParityFailure::OursDiffersFromReference]);
        let Judgement::Fails(f) = j else {
            unreachable!()
        };
        assert!(f[0].1[0].to_string().contains("ours"), "{:?}", f[0].1);
        assert!(f[0].1[0].to_string().contains("reference"), "{:?}", f[0].1);
    }

    #[test]
    fn where_upstream_answered_some_nodes_the_reference_must_match_them() {
        let i = Instance {
            adversarial: true,
            ..Default::default()
        };
        let upstream = pod(vec![
            node("node-1", VerdictKind::Error, Some("timeout"), &[]),
            node("node-2", VerdictKind::Allocated, None, &["small-0"]),
        ]);
        let reference = pod(vec![
            node("node-1", VerdictKind::Unsatisfiable, None, &[]),
            node("node-2", VerdictKind::Allocated, None, &["small-0"]),
        ]);
        assert_eq!(
            judge_plain(&i, &reference, &upstream, &reference),
            Judgement::DecidedPastUpstreamTimeout
        );
        let off = pod(vec![
            node("node-1", VerdictKind::Unsatisfiable, None, &[]),
            node("node-2", VerdictKind::Allocated, None, &["small-1"]),
        ]);
        assert_eq!(
            failures(&judge_plain(&i, &off, &upstream, &off)),
            [ParityFailure::ReferenceDiffersFromUpstream]
        );
    }

    /// An instance whose claim in use holds a share of a device that is not multi-allocatable.
    fn shared_non_multi() -> Instance {
        let mut slice = ResourceSlice::default();
        slice.spec.driver = "driver-a".into();
        slice.spec.pool.name = "pool".into();
        slice.spec.devices = Some(vec![Device {
            name: "dev-0".into(),
            ..Default::default()
        }]);
        let mut result = allocation(&["dev-0"]);
        if let Some(r) = result.devices.as_mut().and_then(|d| d.results.as_mut()) {
            r[0].share_id = Some("share-1".into());
        }
        Instance {
            slices: vec![slice],
            allocated_claims: vec![ResourceClaim {
                status: Some(ResourceClaimStatus {
                    allocation: Some(result),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_deviation_explains_only_when_tessera_equals_upstream_on_the_stripped_instance() {
        let i = shared_non_multi();
        let (ours, upstream) = (fits(&["dev-1"]), fits(&["dev-0"]));
        let mut asked = Vec::new();
        let mut upstream_stripped = |stripped: &Instance| {
            asked.push(stripped.clone());
            Ok(fits(&["dev-1"]))
        };
        let j = judge(
            &i,
            &ours,
            &upstream,
            &upstream,
            &["shared-non-multi"],
            &mut upstream_stripped,
        )
        .unwrap();
        assert_eq!(j, Judgement::Explained("shared-non-multi"));
        assert_eq!(asked.len(), 1);
        assert!(changes_beyond("shared-non-multi", &i, &asked[0]).is_empty());
        assert_ne!(asked[0], i, "the share ID was taken out");

        let mut still_differs = |_: &Instance| Ok(fits(&["dev-0"]));
        let j = judge(
            &i,
            &ours,
            &upstream,
            &upstream,
            &["shared-non-multi"],
            &mut still_differs,
        )
        .unwrap();
        assert_eq!(failures(&j), [ParityFailure::OursDiffersFromUpstream]);
        let j = judge_plain(&i, &ours, &upstream, &upstream);
        assert_eq!(
            failures(&j),
            [ParityFailure::OursDiffersFromUpstream],
            "switch off"
        );
    }

    #[test]
    fn changes_outside_the_deviations_fields_are_reported() {
        let before = shared_non_multi();
        let mut after = before.clone();
        Switches::disable("shared-non-multi", &mut after);
        assert!(changes_beyond("shared-non-multi", &before, &after).is_empty());
        after.slices[0].spec.devices.as_mut().unwrap()[0].name = "dev-9".into();
        let beyond = changes_beyond("shared-non-multi", &before, &after);
        assert_eq!(beyond.len(), 1);
        assert_eq!(
            beyond[0].what,
            "instance field /slices/0/spec/devices/0/name"
        );
        assert!(!changes_beyond("adversarial", &before, &shared_non_multi_stripped()).is_empty());
    }

    fn shared_non_multi_stripped() -> Instance {
        let mut i = shared_non_multi();
        Switches::disable("shared-non-multi", &mut i);
        i
    }

    #[test]
    fn coverage_counts_features_and_names_what_falls_short() {
        let mut slice = ResourceSlice::default();
        slice.spec.driver = "driver-a".into();
        slice.spec.pool.name = "pool".into();
        slice.spec.devices = Some(vec![Device {
            name: "dev-0".into(),
            consumes_counters: Some(vec![Default::default()]),
            ..Default::default()
        }]);
        let i = Instance {
            slices: vec![slice],
            ..Default::default()
        };
        let mut v = fits(&["dev-0"]);
        if let Some(r) = v.allocations[0]
            .devices
            .as_mut()
            .and_then(|d| d.results.as_mut())
        {
            r[0].request = "req-0/sub-1".into();
            r[0].admin_access = Some(true);
        }
        let mut c = Coverage::default();
        c.record(&i, &v, false);
        c.record(&i, &timed_out(), true);
        let counted: Vec<(&str, u64)> = c.counts.iter().map(|(k, n)| (*k, *n)).collect();
        assert_eq!(
            counted,
            [
                ("admin", 1),
                ("allocated", 1),
                ("counters", 1),
                ("error", 1),
                ("prioritized-list", 1),
                ("upstream-timeout", 1)
            ]
        );
        let short: Vec<&str> = c
            .shortfalls(1000, true)
            .into_iter()
            .map(|(k, _, _)| k)
            .collect();
        assert_eq!(
            short,
            [
                "allocated",
                "unsatisfiable",
                "error",
                "shared",
                "admin",
                "counters",
                "prioritized-list",
                "upstream-timeout"
            ]
        );
        assert!(
            c.shortfalls(10, false)
                .iter()
                .all(|(k, _, _)| *k == "unsatisfiable")
        );
    }
}
