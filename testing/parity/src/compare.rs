//! Comparing two verdicts: the same outcome kind, the same node, the same devices (and the rest
//! of each allocation result), the same error class — for the pod and for every node.
//!
//! Normalised before comparing: share IDs (random upstream, derived in Tessera) compare by
//! presence; consumed-capacity quantities by value; messages are not compared.

use k8s_openapi::api::resource::v1::AllocationResult;
use serde_json::Value;

use crate::instance::{NodeVerdict, Verdict, VerdictKind};
// The reference's own quantity parser: the judge reads no quantity with Tessera's code.
use crate::reference::quantity::Nanos;

/// One way two verdicts differ.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// `pod` or `node <name>`, then what differs.
    pub what: String,
    pub left: String,
    pub right: String,
    /// Whose the two sides are: `ours` and `upstream` unless [`Difference::between`] says else.
    pub sides: [&'static str; 2],
}

impl Difference {
    /// A difference between `left` and `right` in `what`.
    pub fn new(
        what: impl Into<String>,
        left: impl Into<String>,
        right: impl Into<String>,
    ) -> Difference {
        Difference {
            what: what.into(),
            left: left.into(),
            right: right.into(),
            sides: ["ours", "upstream"],
        }
    }

    /// The same difference between two other sides.
    pub fn between(mut self, left: &'static str, right: &'static str) -> Difference {
        self.sides = [left, right];
        self
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} {} / {} {}",
            self.what, self.sides[0], self.left, self.sides[1], self.right
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
        out.push(Difference::new(
            "nodes evaluated",
            names(&ours.nodes).join(","),
            names(&upstream.nodes).join(","),
        ));
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

/// The differences between two verdicts on one node.
pub fn compare_node(ours: &NodeVerdict, upstream: &NodeVerdict) -> Vec<Difference> {
    let mut out = Vec::new();
    compare_one(
        &format!("node {}", ours.node),
        (
            ours.outcome,
            None,
            &ours.allocations,
            ours.error_class.as_deref(),
        ),
        (
            upstream.outcome,
            None,
            &upstream.allocations,
            upstream.error_class.as_deref(),
        ),
        &mut out,
    );
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
        out.push(Difference::new(format!("{what} {field}"), o, u))
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
                        && let Some(n) = Nanos::parse(text)
                    {
                        *v = Value::String(format!("{}n", n.0));
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{DeviceAllocationResult, DeviceRequestAllocationResult};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn result(device: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: "req-0".into(),
            driver: "driver-a".into(),
            pool: "pool".into(),
            device: device.into(),
            ..Default::default()
        }
    }

    fn allocation(results: Vec<DeviceRequestAllocationResult>) -> AllocationResult {
        AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: None,
            }),
            ..Default::default()
        }
    }

    /// A pod allocated on node-1 (one of two nodes evaluated), with `results`.
    fn allocated(results: Vec<DeviceRequestAllocationResult>) -> Verdict {
        let allocations = vec![allocation(results)];
        Verdict {
            name: "case".into(),
            outcome: VerdictKind::Allocated,
            node: Some("node-1".into()),
            allocations: allocations.clone(),
            error_class: None,
            message: None,
            stage: None,
            nodes: vec![
                NodeVerdict {
                    node: "node-1".into(),
                    outcome: VerdictKind::Allocated,
                    error_class: None,
                    message: None,
                    allocations,
                    micros: 7,
                },
                NodeVerdict {
                    node: "node-2".into(),
                    outcome: VerdictKind::Unsatisfiable,
                    error_class: None,
                    message: None,
                    allocations: Vec::new(),
                    micros: 3,
                },
            ],
        }
    }

    fn shared(device: &str, share: &str, consumed: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            share_id: Some(share.into()),
            consumed_capacity: Some([("memory".to_owned(), Quantity(consumed.into()))].into()),
            ..result(device)
        }
    }

    #[test]
    fn what_is_normalised_away_makes_no_difference() {
        // Different share IDs, the same capacity written two ways, messages, timings, an
        // explicit `adminAccess: false` and empty lists on one side only.
        let mut ours = allocated(vec![shared("dev-0", "derived-0", "1Gi"), result("dev-1")]);
        let mut upstream = allocated(vec![
            shared("dev-0", "8c1f-uuid", "1073741824"),
            DeviceRequestAllocationResult {
                admin_access: Some(false),
                tolerations: Some(Vec::new()),
                ..result("dev-1")
            },
        ]);
        ours.message = Some("fits".into());
        upstream.message = Some("allocated".into());
        upstream.nodes[0].micros = 99_999;
        assert_eq!(compare(&ours, &upstream), Vec::new());
        upstream.stage = Some("filter".into());
        ours.nodes[1].error_class = Some("invalid-pools".into());
        assert_eq!(
            compare(&ours, &upstream),
            Vec::new(),
            "stages, and error classes of unsatisfiable nodes, are not compared"
        );
    }

    #[test]
    fn a_swapped_device_differs_for_the_pod_and_its_node() {
        let ours = allocated(vec![result("dev-0"), result("dev-2")]);
        let upstream = allocated(vec![result("dev-0"), result("dev-1")]);
        let whats: Vec<String> = compare(&ours, &upstream)
            .into_iter()
            .map(|d| d.what)
            .collect();
        assert_eq!(whats, ["pod allocation", "node node-1 allocation"]);
    }

    #[test]
    fn a_share_against_a_whole_device_differs() {
        let ours = allocated(vec![shared("dev-0", "s", "1Gi")]);
        let upstream = allocated(vec![result("dev-0")]);
        assert_eq!(compare(&ours, &upstream).len(), 2);
        let other_amount = allocated(vec![shared("dev-0", "s", "2Gi")]);
        assert_eq!(
            compare(&ours, &other_amount).len(),
            2,
            "consumed capacity by value"
        );
    }

    #[test]
    fn a_flipped_outcome_differs_with_both_kinds_named() {
        let ours = allocated(vec![result("dev-0")]);
        let mut upstream = ours.clone();
        upstream.outcome = VerdictKind::Unsatisfiable;
        upstream.node = None;
        upstream.allocations.clear();
        let d = compare(&ours, &upstream);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].to_string(),
            "pod outcome: ours allocated / upstream unsatisfiable"
        );
    }

    #[test]
    fn the_node_chosen_and_the_error_class_are_compared() {
        let ours = allocated(vec![result("dev-0")]);
        let mut upstream = ours.clone();
        upstream.node = Some("node-2".into());
        assert_eq!(compare(&ours, &upstream)[0].what, "pod node");
        let mut a = ours.clone();
        let mut b = ours.clone();
        for (v, class) in [(&mut a, "cel-runtime"), (&mut b, "cel-compile")] {
            v.outcome = VerdictKind::Error;
            v.allocations.clear();
            v.error_class = Some(class.into());
            v.nodes[0].outcome = VerdictKind::Error;
            v.nodes[0].allocations.clear();
            v.nodes[0].error_class = Some(class.into());
        }
        let whats: Vec<String> = compare(&a, &b).into_iter().map(|d| d.what).collect();
        assert_eq!(whats, ["pod error class", "node node-1 error class"]);
    }

    #[test]
    fn different_nodes_evaluated_differ() {
        let ours = allocated(vec![result("dev-0")]);
        let mut upstream = ours.clone();
        upstream.nodes.pop();
        let d = compare(&ours, &upstream);
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].to_string(),
            "nodes evaluated: ours node-1,node-2 / upstream node-1"
        );
    }

    #[test]
    fn normalize_keeps_what_matters_and_drops_what_does_not() {
        let value = normalize(&[allocation(vec![
            DeviceRequestAllocationResult {
                admin_access: Some(true),
                ..shared("dev-0", "abc", "1536Mi")
            },
            DeviceRequestAllocationResult {
                admin_access: Some(false),
                binding_conditions: Some(Vec::new()),
                ..result("dev-1")
            },
        ])]);
        let results = &value[0]["devices"]["results"];
        assert_eq!(results[0]["shareID"], "<share>");
        assert_eq!(results[0]["adminAccess"], true);
        assert_eq!(
            results[0]["consumedCapacity"]["memory"],
            format!("{}n", 1536u128 * 1024 * 1024 * 1_000_000_000)
        );
        let second = results[1].as_object().unwrap();
        let mut keys: Vec<&str> = second.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["device", "driver", "pool", "request"]);
    }
}
