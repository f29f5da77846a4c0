//! Comparing two verdicts: the same outcome kind, the same node, the same devices (and the rest
//! of each allocation result), the same error class — for the pod and for every node.
//!
//! Normalised before comparing: share IDs (random upstream, derived in Tessera) compare by
//! presence; consumed-capacity quantities by value; messages are not compared.

use k8s_openapi::api::resource::v1::AllocationResult;
use serde_json::Value;
use tessera_allocator::quantity::Amount;

use crate::instance::{NodeVerdict, Verdict, VerdictKind};

/// One way two verdicts differ.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// `pod` or `node <name>`, then what differs.
    pub what: String,
    pub ours: String,
    pub upstream: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: ours {} / upstream {}",
            self.what, self.ours, self.upstream
        )
    }
}

/// Every difference between our verdict and upstream's.
pub fn compare(ours: &Verdict, upstream: &Verdict) -> Vec<Difference> {
    let mut out = Vec::new();
    compare_one(
        "pod",
        (
            ours.outcome,
            ours.node.as_deref(),
            &ours.allocations,
            ours.error_class.as_deref(),
        ),
        (
            upstream.outcome,
            upstream.node.as_deref(),
            &upstream.allocations,
            upstream.error_class.as_deref(),
        ),
        &mut out,
    );
    let names = |v: &[NodeVerdict]| v.iter().map(|n| n.node.clone()).collect::<Vec<_>>();
    if names(&ours.nodes) != names(&upstream.nodes) {
        out.push(Difference {
            what: "nodes evaluated".into(),
            ours: names(&ours.nodes).join(","),
            upstream: names(&upstream.nodes).join(","),
        });
        return out;
    }
    for (o, u) in ours.nodes.iter().zip(&upstream.nodes) {
        compare_one(
            &format!("node {}", o.node),
            (o.outcome, None, &o.allocations, o.error_class.as_deref()),
            (u.outcome, None, &u.allocations, u.error_class.as_deref()),
            &mut out,
        );
    }
    out
}

type Side<'a> = (
    VerdictKind,
    Option<&'a str>,
    &'a [AllocationResult],
    Option<&'a str>,
);

fn compare_one(what: &str, ours: Side<'_>, upstream: Side<'_>, out: &mut Vec<Difference>) {
    let (ok, on, oa, oe) = ours;
    let (uk, un, ua, ue) = upstream;
    let mut diff = |field: &str, o: String, u: String| {
        out.push(Difference {
            what: format!("{what} {field}"),
            ours: o,
            upstream: u,
        })
    };
    if ok != uk {
        diff(
            "outcome",
            format!("{ok}{}", oe.map(|e| format!(" ({e})")).unwrap_or_default()),
            format!("{uk}{}", ue.map(|e| format!(" ({e})")).unwrap_or_default()),
        );
        return;
    }
    match ok {
        VerdictKind::Allocated => {
            if on != un {
                diff("node", on.unwrap_or("-").into(), un.unwrap_or("-").into());
            }
            let (o, u) = (normalize(oa), normalize(ua));
            if o != u {
                diff("allocation", o.to_string(), u.to_string());
            }
        }
        VerdictKind::Error => {
            if oe != ue {
                diff(
                    "error class",
                    oe.unwrap_or("-").into(),
                    ue.unwrap_or("-").into(),
                );
            }
        }
        VerdictKind::Unsatisfiable => {}
    }
}

/// Allocation results as JSON with share IDs reduced to their presence, consumed capacities to
/// exact values, empty lists and maps dropped (Go's `omitempty`), and no timestamp.
pub fn normalize(results: &[AllocationResult]) -> Value {
    let mut value = serde_json::to_value(results).unwrap_or(Value::Null);
    for result in value.as_array_mut().into_iter().flatten() {
        if let Some(o) = result.as_object_mut() {
            o.remove("allocationTimestamp");
        }
        let devices = result
            .pointer_mut("/devices/results")
            .and_then(Value::as_array_mut);
        for device in devices.into_iter().flatten() {
            let Some(d) = device.as_object_mut() else {
                continue;
            };
            if d.contains_key("shareID") {
                d.insert("shareID".into(), Value::String("<share>".into()));
            }
            if let Some(Value::Object(consumed)) = d.get_mut("consumedCapacity") {
                for v in consumed.values_mut() {
                    if let Some(text) = v.as_str()
                        && let Ok(a) = Amount::parse(text)
                    {
                        *v = Value::String(format!("{}n", a.nanos()));
                    }
                }
            }
        }
    }
    strip_empty(&mut value);
    value
}

fn strip_empty(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for x in map.values_mut() {
                strip_empty(x);
            }
            map.retain(|_, x| match x {
                Value::Null => false,
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                Value::Bool(b) => *b,
                _ => true,
            });
        }
        Value::Array(items) => items.iter_mut().for_each(strip_empty),
        _ => {}
    }
}

/// Upstream's verdict with every node where upstream's Filter timed out (10 s) replaced by our
/// verdict on that node, and the pod's verdict recomputed from the nodes as the scheduler does
/// (an error on any node fails the pod; else the first node that fits); `None` when upstream
/// timed out nowhere. A difference that disappears here is the documented deviation "upstream
/// timeout": Tessera decides what upstream gave up on.
pub fn without_upstream_timeouts(ours: &Verdict, upstream: &Verdict) -> Option<Verdict> {
    if !upstream
        .nodes
        .iter()
        .any(|n| n.error_class.as_deref() == Some("timeout"))
    {
        return None;
    }
    let mut v = upstream.clone();
    for n in &mut v.nodes {
        if n.error_class.as_deref() == Some("timeout")
            && let Some(mine) = ours.nodes.iter().find(|m| m.node == n.node)
        {
            *n = mine.clone();
        }
    }
    v.outcome = VerdictKind::Unsatisfiable;
    v.node = None;
    v.allocations = Vec::new();
    v.error_class = None;
    if let Some(e) = v.nodes.iter().find(|n| n.outcome == VerdictKind::Error) {
        v.outcome = VerdictKind::Error;
        v.node = Some(e.node.clone());
        v.error_class = e.error_class.clone();
    } else if let Some(a) = v.nodes.iter().find(|n| n.outcome == VerdictKind::Allocated) {
        v.outcome = VerdictKind::Allocated;
        v.node = Some(a.node.clone());
        v.allocations = a.allocations.clone();
    }
    Some(v)
}
