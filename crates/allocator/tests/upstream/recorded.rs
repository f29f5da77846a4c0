//! Every case of upstream's shared allocator test table (`allocatortesting.TestAllocator`,
//! k8s.io/dynamic-resource-allocation v0.37.1: 275 cases), replayed.
//!
//! `cases.json` is recorded by `tests/parity/record-upstream-cases`: upstream's table runs with an
//! allocator that records each case's objects (classes, slices, allocated state, node, claims)
//! and result; each case is then decided again the way kube-scheduler v1.37.1 decides it (its
//! default feature gates, PreFilter, Filter). That scheduler verdict is what first fit promises,
//! so it is the expectation here — outcome kind, error class, and every allocation result
//! (share IDs by presence, consumed capacity by value). The exception: cases that need
//! `DRAListTypeAttributes`, which Tessera implements although the scheduler has it off (with it
//! off the API server drops list attributes, so a cluster with them has the gate on): those
//! expect the case's own result under its features.
//!
//! Cases that do not apply are listed in [`NOT_APPLICABLE`] with the reason; the test fails if a
//! listed case starts to match (the list must not go stale) or if the file does not hold all 275.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;
use serde_json::Value;
use tessera_allocator::quantity::Amount;
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceId, DeviceIndex, Outcome, PlacementMode,
};

/// Cases whose expectation does not apply to Tessera, and why.
const NOT_APPLICABLE: &[(&str, &str)] = &[(
    "list-attributes-disabled-match-constraint-with-lists",
    "list attributes with DRAListTypeAttributes off: the API server drops list attributes while \
     the gate is off, so a cluster that has them runs with it on; Tessera implements the gate-on \
     semantics (matchAttribute over lists matches on a shared element)",
)];

/// Upstream's table, as recorded.
const UPSTREAM_CASES: usize = 275;

#[derive(Deserialize)]
struct File {
    cases: Vec<Recorded>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Recorded {
    name: String,
    features: Vec<String>,
    instance: CaseInstance,
    #[serde(default)]
    case_results: Vec<AllocationResult>,
    #[serde(default)]
    case_error: Option<String>,
    scheduler: SchedulerVerdict,
}

#[derive(Deserialize)]
struct DeviceRef {
    driver: String,
    pool: String,
    device: String,
}

#[derive(Deserialize)]
struct Shared {
    #[serde(flatten)]
    device: DeviceRef,
    #[serde(rename = "shareID")]
    share_id: String,
}

#[derive(Deserialize)]
struct Consumed {
    #[serde(flatten)]
    device: DeviceRef,
    capacity: BTreeMap<String, Quantity>,
}

#[derive(Deserialize, Default)]
struct State {
    #[serde(default)]
    devices: Vec<DeviceRef>,
    #[serde(default)]
    shared: Vec<Shared>,
    #[serde(default)]
    consumed: Vec<Consumed>,
}

#[derive(Deserialize)]
struct CaseInstance {
    nodes: Vec<Node>,
    #[serde(default)]
    slices: Vec<ResourceSlice>,
    #[serde(default)]
    classes: Vec<DeviceClass>,
    claims: Vec<ResourceClaim>,
    #[serde(default)]
    state: Option<State>,
    node: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchedulerVerdict {
    outcome: String,
    #[serde(default)]
    error_class: Option<String>,
    #[serde(default)]
    allocations: Vec<AllocationResult>,
}

/// What a verdict comes down to for the comparison.
#[derive(Debug, PartialEq)]
enum Verdict {
    Allocated(Value),
    Unsatisfiable,
    Error(String),
}

fn expected(case: &Recorded) -> Verdict {
    if case.features.iter().any(|f| f == "DRAListTypeAttributes") {
        return match &case.case_error {
            Some(e) if e.contains("invalid resource pools were encountered") => {
                Verdict::Unsatisfiable
            }
            Some(e) => Verdict::Error(classify(e).into()),
            None if case.case_results.is_empty() => Verdict::Unsatisfiable,
            None => Verdict::Allocated(normalize(&case.case_results)),
        };
    }
    match case.scheduler.outcome.as_str() {
        "allocated" => Verdict::Allocated(normalize(&case.scheduler.allocations)),
        "error" => Verdict::Error(case.scheduler.error_class.clone().unwrap_or_default()),
        _ => Verdict::Unsatisfiable,
    }
}

fn ours(case: &Recorded) -> Verdict {
    let inst = &case.instance;
    let inv = DeviceIndex::from_nodes(inst.slices.clone(), inst.classes.clone(), &inst.nodes);
    let mut state = AllocatedState::new();
    if let Some(s) = &inst.state {
        let id = |d: &DeviceRef| DeviceId::new(&d.driver, &d.pool, &d.device);
        for d in &s.devices {
            state.insert_device(id(d));
        }
        for d in &s.shared {
            state.insert_shared(id(&d.device), &d.share_id, []);
        }
        for d in &s.consumed {
            let consumed = d
                .capacity
                .iter()
                .map(|(k, q)| (k.clone(), Amount::from_quantity(q).expect("quantity")));
            state.insert_consumed(id(&d.device), consumed);
        }
    }
    let options = AllocateOptions {
        mode: PlacementMode::FirstFit,
        explain: false,
        ..AllocateOptions::default()
    };
    match inv.allocate(&inst.claims, &state, Some(&inst.node), &options) {
        Ok(Outcome::Allocated(a)) => {
            let results: Vec<AllocationResult> = a.claims.into_iter().map(|c| c.result).collect();
            Verdict::Allocated(normalize(&results))
        }
        Ok(Outcome::Unsatisfiable(_)) => Verdict::Unsatisfiable,
        Err(e) => Verdict::Error(error_class(&e).into()),
    }
}

/// The class of an upstream error message (as tests/parity's oracle names them).
fn classify(message: &str) -> &'static str {
    let has = |parts: &[&str]| parts.iter().any(|p| message.contains(p));
    if has(&["CEL runtime error"]) {
        "cel-runtime"
    } else if has(&["CEL compile error"]) {
        "cel-compile"
    } else if has(&["asks for all devices, but resource pool"]) {
        "all-pool-unusable"
    } else if has(&["because a claim constraint would not be satisfied"]) {
        "all-constraint"
    } else if has(&["exceeds the claim limit"]) {
        "too-many-devices"
    } else if has(&[
        "checking capacity",
        "computing consumed capacity",
        "rechecking capacity",
    ]) {
        "capacity"
    } else if has(&["NodeSelector", "node selection", "node selector"]) {
        "node-selector"
    } else {
        "invalid-request"
    }
}

fn error_class(e: &AllocateError) -> &'static str {
    match e {
        AllocateError::CelRuntime { .. } => "cel-runtime",
        AllocateError::CelCompile { .. } => "cel-compile",
        AllocateError::AllOnUnusablePool { .. } => "all-pool-unusable",
        AllocateError::ConstraintRejectsAll { .. } => "all-constraint",
        AllocateError::TooManyDevices { .. } => "too-many-devices",
        AllocateError::SearchBudgetExhausted { .. } => "timeout",
        AllocateError::UnsupportedNodeSelector { .. } => "node-selector",
        AllocateError::InvalidCapacityRequest { .. } => "capacity",
        _ => "invalid-request",
    }
}

/// Allocation results with share IDs reduced to their presence, consumed capacities to exact
/// values, empty fields dropped, no timestamp.
fn normalize(results: &[AllocationResult]) -> Value {
    let mut value = serde_json::to_value(results).expect("serializable");
    for result in value.as_array_mut().into_iter().flatten() {
        if let Some(o) = result.as_object_mut() {
            o.remove("allocationTimestamp");
        }
        let devices = result
            .pointer_mut("/devices/results")
            .and_then(Value::as_array_mut);
        for d in devices
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            if d.contains_key("shareID") {
                d.insert("shareID".into(), Value::String("<share>".into()));
            }
            if let Some(Value::Object(consumed)) = d.get_mut("consumedCapacity") {
                for v in consumed.values_mut() {
                    if let Some(a) = v.as_str().and_then(|t| Amount::parse(t).ok()) {
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

#[test]
fn every_upstream_case() {
    let file: File = serde_json::from_str(include_str!("cases.json")).expect("cases.json decodes");
    assert_eq!(
        file.cases.len(),
        UPSTREAM_CASES,
        "cases.json is not the whole table"
    );
    let mut failures = Vec::new();
    let mut exempt_but_matching = Vec::new();
    for case in &file.cases {
        let (want, got) = (expected(case), ours(case));
        let exempt = NOT_APPLICABLE.iter().find(|(n, _)| *n == case.name);
        match (want == got, exempt) {
            (true, Some(_)) => exempt_but_matching.push(case.name.clone()),
            (false, None) => failures.push(format!(
                "{} (features {:?}):\n  want {want:?}\n  got  {got:?}",
                case.name, case.features
            )),
            _ => {}
        }
    }
    assert!(
        exempt_but_matching.is_empty(),
        "listed as not applicable but matching now: {exempt_but_matching:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {} upstream cases differ:\n{}",
        failures.len(),
        file.cases.len(),
        failures.join("\n")
    );
}
