//! Builders for allocator tests, named after the helpers in upstream's allocator_testing.go.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements,
    Counter, CounterSet, Device, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceAttribute, DeviceCapacity, DeviceClaim, DeviceClaimConfiguration, DeviceClass,
    DeviceClassConfiguration, DeviceClassSpec, DeviceConstraint, DeviceCounterConsumption,
    DeviceRequest, DeviceRequestAllocationResult, DeviceSelector, DeviceSubRequest, DeviceTaint,
    DeviceToleration, ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaim,
    ResourceClaimSpec, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use tessera_allocator::{
    AllocateError, AllocateOptions, AllocatedState, DeviceIndex, NodeInfo, Outcome, PlacementMode,
};

/// Shared with the other crates' tests (`tessera-test-support`); each test target uses some.
#[allow(unused_imports)]
pub use tessera_test_support::objects::{
    bool_attr, cel_selector as selector, int_attr, string_attr, version_attr,
};

pub const REGION1: &str = "region-1";
pub const REGION2: &str = "region-2";
pub const NODE1: &str = "node-1";
pub const NODE2: &str = "node-2";
pub const CLASS_A: &str = "class-a";
pub const CLASS_B: &str = "class-b";
pub const DRIVER_A: &str = "driver-a";
pub const DRIVER_B: &str = "driver-b";
pub const POOL1: &str = "pool-1";
pub const POOL2: &str = "pool-2";
pub const POOL3: &str = "pool-3";
pub const POOL4: &str = "pool-4";
pub const REQ0: &str = "req-0";
pub const REQ1: &str = "req-1";
pub const REQ2: &str = "req-2";
pub const REQ3: &str = "req-3";
pub const SUB0: &str = "subReq-0";
pub const SUB1: &str = "subReq-1";
pub const CLAIM0: &str = "claim-0";
pub const CLAIM1: &str = "claim-1";
pub const SLICE1: &str = "slice-1";
pub const SLICE2: &str = "slice-2";
pub const SLICE3: &str = "slice-3";
pub const SLICE4: &str = "slice-4";
pub const DEVICE0: &str = "device-0";
pub const DEVICE1: &str = "device-1";
pub const DEVICE2: &str = "device-2";
pub const DEVICE3: &str = "device-3";
pub const DEVICE4: &str = "device-4";
pub const COUNTER_SET1: &str = "counter-set-1";
pub const COUNTER_SET2: &str = "counter-set-2";
pub const CAPACITY0: &str = "capacity-0";
pub const CAPACITY1: &str = "capacity-1";
pub const FIXED_SHARE_ID: &str = "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";

pub const INT_ATTRIBUTE: &str = "driver-a/numa";
pub const STRING_ATTRIBUTE: &str = "driver-a/stringAttribute";
pub const BOOL_ATTRIBUTE: &str = "driver-a/boolAttribute";
pub const VERSION_ATTRIBUTE: &str = "driver-a/driverVersion";
pub const NON_EXISTENT_ATTRIBUTE: &str = "driver-a/NonExistentAttribute";

/// Applies `f` to `t` and returns it.
pub fn with<T>(mut t: T, f: impl FnOnce(&mut T)) -> T {
    f(&mut t);
    t
}

pub fn q(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

pub fn node(name: &str, region: &str) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        labels: [("region", region), ("planet", "earth")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    }
}

/// A request selector `device.capacity["driver-a"].memory.compareTo(quantity(X)) >= 0`.
pub fn memory_at_least(quantity: &str) -> DeviceSelector {
    selector(&format!(
        "device.capacity[\"{DRIVER_A}\"].memory.compareTo(quantity(\"{quantity}\")) >= 0"
    ))
}

pub fn class(name: &str, driver: &str) -> DeviceClass {
    class_with_selectors(
        name,
        vec![selector(&format!("device.driver == \"{driver}\""))],
    )
}

pub fn class_with_selectors(name: &str, selectors: Vec<DeviceSelector>) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(selectors),
            ..Default::default()
        }),
    }
}

/// `classWithAllowMultipleAllocations`.
pub fn class_multi(name: &str, driver: &str, multi: bool) -> DeviceClass {
    class_with_selectors(
        name,
        vec![selector(&format!(
            "device.driver == \"{driver}\" && device.allowMultipleAllocations == {multi}"
        ))],
    )
}

pub fn opaque(driver: &str, attribute: &str) -> OpaqueDeviceConfiguration {
    OpaqueDeviceConfiguration {
        driver: driver.into(),
        parameters: RawExtension(serde_json::json!({ attribute: format!("{attribute}Value") })),
    }
}

pub fn class_with_config(name: &str, driver: &str, attribute: &str) -> DeviceClass {
    with(class(name, driver), |c| {
        c.spec.as_mut().unwrap().config = Some(vec![DeviceClassConfiguration {
            opaque: Some(opaque(driver, attribute)),
        }])
    })
}

pub fn claim(name: &str, requests: Vec<DeviceRequest>) -> ResourceClaim {
    claim_with(name, requests, vec![], vec![])
}

pub fn claim_with(
    name: &str,
    requests: Vec<DeviceRequest>,
    constraints: Vec<DeviceConstraint>,
    config: Vec<DeviceClaimConfiguration>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config: (!config.is_empty()).then_some(config),
            }),
        }),
        status: None,
    }
}

/// `claimWithRequest`: one request for one device of `class`.
pub fn simple_claim(name: &str, req: &str, class: &str) -> ResourceClaim {
    claim(name, vec![request(req, class, 1)])
}

pub fn request(name: &str, class: &str, count: i64) -> DeviceRequest {
    tessera_test_support::objects::exact_request(name, class, count)
}

pub fn request_with(
    name: &str,
    class: &str,
    count: i64,
    f: impl FnOnce(&mut ExactDeviceRequest),
) -> DeviceRequest {
    with(request(name, class, count), |r| {
        f(r.exactly.as_mut().unwrap())
    })
}

pub fn all_request(name: &str, class: &str) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some("All".into()),
            ..Default::default()
        }),
        first_available: None,
    }
}

pub fn first_available(name: &str, subs: Vec<DeviceSubRequest>) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: None,
        first_available: Some(subs),
    }
}

pub fn sub(name: &str, class: &str, count: i64) -> DeviceSubRequest {
    DeviceSubRequest {
        name: name.into(),
        device_class_name: class.into(),
        allocation_mode: Some("ExactCount".into()),
        count: Some(count),
        ..Default::default()
    }
}

pub fn sub_with(
    name: &str,
    class: &str,
    count: i64,
    f: impl FnOnce(&mut DeviceSubRequest),
) -> DeviceSubRequest {
    with(sub(name, class, count), f)
}

pub fn capacity_request(value: &str) -> CapacityRequirements {
    CapacityRequirements {
        requests: Some([(CAPACITY0.to_owned(), q(value))].into()),
    }
}

pub fn match_attribute(attribute: &str, requests: &[&str]) -> DeviceConstraint {
    DeviceConstraint {
        match_attribute: Some(attribute.into()),
        requests: (!requests.is_empty())
            .then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        ..Default::default()
    }
}

pub fn distinct_attribute(attribute: &str, requests: &[&str]) -> DeviceConstraint {
    DeviceConstraint {
        distinct_attribute: Some(attribute.into()),
        requests: (!requests.is_empty())
            .then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        ..Default::default()
    }
}

pub fn claim_config(requests: &[&str], driver: &str, attribute: &str) -> DeviceClaimConfiguration {
    DeviceClaimConfiguration {
        requests: (!requests.is_empty())
            .then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        opaque: Some(opaque(driver, attribute)),
    }
}

pub fn device(name: &str) -> Device {
    Device {
        name: name.into(),
        ..Default::default()
    }
}

pub fn strings_attr(v: &[&str]) -> DeviceAttribute {
    DeviceAttribute {
        strings: Some(v.iter().map(|s| (*s).to_owned()).collect()),
        ..Default::default()
    }
}

pub fn attrs(mut d: Device, attrs: &[(&str, DeviceAttribute)]) -> Device {
    d.attributes
        .get_or_insert_with(BTreeMap::new)
        .extend(attrs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    d
}

pub fn capacity(mut d: Device, caps: &[(&str, &str)]) -> Device {
    d.capacity
        .get_or_insert_with(BTreeMap::new)
        .extend(caps.iter().map(|(k, v)| {
            (
                (*k).to_owned(),
                DeviceCapacity {
                    value: q(v),
                    request_policy: None,
                },
            )
        }));
    d
}

/// `withDeviceCounterConsumption`; with `from_counters`, capacity mirrors the counters.
pub fn consuming(
    mut d: Device,
    set: &str,
    counters: &[(&str, &str)],
    from_counters: bool,
) -> Device {
    let counters: BTreeMap<String, Counter> = counters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Counter { value: q(v) }))
        .collect();
    if from_counters {
        d.capacity = Some(
            counters
                .iter()
                .map(|(k, c)| {
                    (
                        k.clone(),
                        DeviceCapacity {
                            value: c.value.clone(),
                            request_policy: None,
                        },
                    )
                })
                .collect(),
        );
    }
    d.consumes_counters
        .get_or_insert_with(Vec::new)
        .push(DeviceCounterConsumption {
            counter_set: set.into(),
            counters,
            compatibility_groups: None,
        });
    d
}

/// `withAllowMultipleAllocations`.
pub fn multi(mut d: Device) -> Device {
    d.allow_multiple_allocations = Some(true);
    d
}

/// `withCapacityRequestPolicyRange`: default 2, range min 2 step 2 max 4.
pub fn policy_range(mut d: Device, capacity: &str) -> Device {
    d.capacity.get_or_insert_with(BTreeMap::new).insert(
        CAPACITY0.into(),
        DeviceCapacity {
            value: q(capacity),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("2")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("2"),
                    step: Some(q("2")),
                    max: Some(q("4")),
                }),
                valid_values: None,
            }),
        },
    );
    d
}

/// `withCapacityRequestPolicyValidValues`: the default first, then the others.
pub fn policy_values(mut d: Device, default: &str, capacity: &str, more: &[&str]) -> Device {
    let mut values = vec![q(default)];
    values.extend(more.iter().map(|v| q(v)));
    d.capacity.get_or_insert_with(BTreeMap::new).insert(
        CAPACITY0.into(),
        DeviceCapacity {
            value: q(capacity),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q(default)),
                valid_range: None,
                valid_values: Some(values),
            }),
        },
    );
    d
}

pub fn taint(key: &str, value: &str, effect: &str) -> DeviceTaint {
    DeviceTaint {
        key: key.into(),
        value: Some(value.into()),
        effect: effect.into(),
        time_added: None,
    }
}

pub fn tainted(mut d: Device, taints: &[DeviceTaint]) -> Device {
    d.taints
        .get_or_insert_with(Vec::new)
        .extend(taints.iter().cloned());
    d
}

pub fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> DeviceToleration {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    DeviceToleration {
        key: opt(key),
        operator: opt(operator),
        value: opt(value),
        effect: opt(effect),
        toleration_seconds: None,
    }
}

/// How a slice selects nodes.
pub enum On {
    Node(&'static str),
    All,
    Selector(NodeSelector),
    PerDevice,
}

pub fn pool(name: &str, count: i64) -> ResourcePool {
    ResourcePool {
        name: name.into(),
        generation: 1,
        resource_slice_count: count,
    }
}

pub fn slice(
    name: &str,
    on: On,
    pool_: ResourcePool,
    driver: &str,
    devices: Vec<Device>,
) -> ResourceSlice {
    let mut spec = ResourceSliceSpec {
        driver: driver.into(),
        pool: pool_,
        devices: (!devices.is_empty()).then_some(devices),
        ..Default::default()
    };
    match on {
        On::Node(n) => spec.node_name = Some(n.into()),
        On::All => spec.all_nodes = Some(true),
        On::Selector(s) => spec.node_selector = Some(s),
        On::PerDevice => spec.per_device_node_selection = Some(true),
    }
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec,
    }
}

/// A slice on `node` in a single-slice pool.
pub fn node_slice(
    name: &str,
    node: &'static str,
    pool_name: &str,
    driver: &str,
    devices: Vec<Device>,
) -> ResourceSlice {
    slice(name, On::Node(node), pool(pool_name, 1), driver, devices)
}

/// `sliceWithOneDevice` on node-1.
pub fn one_device_slice(name: &str, pool_name: &str, driver: &str) -> ResourceSlice {
    node_slice(name, NODE1, pool_name, driver, vec![device(DEVICE1)])
}

pub fn counter_slice(
    name: &str,
    on: On,
    pool_: ResourcePool,
    driver: &str,
    sets: &[(&str, &[(&str, &str)])],
) -> ResourceSlice {
    with(slice(name, on, pool_, driver, vec![]), |s| {
        s.spec.shared_counters = Some(
            sets.iter()
                .map(|(set, counters)| CounterSet {
                    name: (*set).into(),
                    counters: counters
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), Counter { value: q(v) }))
                        .collect(),
                })
                .collect(),
        )
    })
}

/// `sliceWithMultipleDevices`: devices `device-0` … `device-(n-1)`.
pub fn devices(n: usize) -> Vec<Device> {
    (0..n).map(|i| device(&format!("device-{i}"))).collect()
}

pub fn label_selector(key: &str, values: &[&str]) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: "In".into(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            match_fields: None,
        }],
    }
}

/// `localNodeSelector`.
pub fn local(node_name: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node_name.into()]),
            }]),
        }],
    }
}

pub fn result(
    request: &str,
    driver: &str,
    pool: &str,
    device: &str,
) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
        ..Default::default()
    }
}

pub fn admin(mut r: DeviceRequestAllocationResult) -> DeviceRequestAllocationResult {
    r.admin_access = Some(true);
    r
}

/// `withConsumedCapacity(&fixedShareID, consumed)`.
pub fn shared(
    mut r: DeviceRequestAllocationResult,
    consumed: &[(&str, &str)],
) -> DeviceRequestAllocationResult {
    r.share_id = Some(FIXED_SHARE_ID.into());
    r.consumed_capacity = (!consumed.is_empty()).then(|| {
        consumed
            .iter()
            .map(|(k, v)| ((*k).to_owned(), q(v)))
            .collect()
    });
    r
}

pub fn tolerating(
    mut r: DeviceRequestAllocationResult,
    t: &[DeviceToleration],
) -> DeviceRequestAllocationResult {
    r.tolerations = Some(t.to_vec());
    r
}

pub fn allocation(
    selector: Option<NodeSelector>,
    results: Vec<DeviceRequestAllocationResult>,
) -> AllocationResult {
    allocation_with_config(selector, results, vec![])
}

pub fn allocation_with_config(
    selector: Option<NodeSelector>,
    results: Vec<DeviceRequestAllocationResult>,
    config: Vec<DeviceAllocationConfiguration>,
) -> AllocationResult {
    AllocationResult {
        allocation_timestamp: None,
        devices: Some(DeviceAllocationResult {
            results: Some(results),
            config: (!config.is_empty()).then_some(config),
        }),
        node_selector: selector,
    }
}

pub fn config(
    source: &str,
    requests: &[&str],
    driver: &str,
    attribute: &str,
) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: (!requests.is_empty())
            .then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        opaque: Some(opaque(driver, attribute)),
    }
}

/// Devices allocated exclusively (upstream's `allocatedDevices`).
pub fn allocated(ids: &[(&str, &str, &str)]) -> AllocatedState {
    let mut state = AllocatedState::new();
    for (driver, pool, device) in ids {
        state.insert_device(tessera_allocator::DeviceId::new(driver, pool, device));
    }
    state
}

/// What a table case expects.
pub enum Expect {
    /// One allocation result per claim (device results compared in any order, like upstream's
    /// `ConsistOf`).
    Results(Vec<AllocationResult>),
    /// The claims fit nowhere (upstream: nil results, no error).
    Unsatisfiable,
    /// The claims fit nowhere, and the explanation contains this text.
    UnsatisfiableBecause(&'static str),
    /// An error whose text contains this.
    Error(&'static str),
}

/// One table case, named after the upstream case it mirrors.
pub struct Case {
    pub name: &'static str,
    pub claims: Vec<ResourceClaim>,
    pub allocated: AllocatedState,
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub node: NodeInfo,
    pub expect: Expect,
}

impl Default for Case {
    fn default() -> Case {
        Case {
            name: "",
            claims: vec![],
            allocated: AllocatedState::new(),
            classes: vec![],
            slices: vec![],
            node: node(NODE1, REGION1),
            expect: Expect::Unsatisfiable,
        }
    }
}

fn normalize(mut r: AllocationResult) -> AllocationResult {
    if let Some(results) = r.devices.as_mut().and_then(|d| d.results.as_mut()) {
        for x in results.iter_mut() {
            if x.share_id.is_some() {
                x.share_id = Some(FIXED_SHARE_ID.into());
            }
        }
        results.sort_by(|a, b| {
            (&a.request, &a.driver, &a.pool, &a.device)
                .cmp(&(&b.request, &b.driver, &b.pool, &b.device))
        });
    }
    r
}

pub fn allocate(case: &Case, mode: PlacementMode) -> Result<Outcome, AllocateError> {
    let inv = DeviceIndex::new(
        case.slices.clone(),
        case.classes.clone(),
        vec![case.node.clone()],
    );
    inv.allocate(
        &case.claims,
        &case.allocated,
        Some(&case.node.name),
        &AllocateOptions {
            mode,
            ..Default::default()
        },
    )
}

/// Runs a case in first-fit mode and checks the expectation; returns a failure description.
pub fn check(case: &Case) -> Result<(), String> {
    let got = allocate(case, PlacementMode::FirstFit);
    let fail = |what: String| Err(format!("case {}: {what}", case.name));
    match (&case.expect, got) {
        (Expect::Results(want), Ok(Outcome::Allocated(a))) => {
            let got: Vec<_> = a.claims.into_iter().map(|c| normalize(c.result)).collect();
            let want: Vec<_> = want.iter().cloned().map(normalize).collect();
            if got != want {
                return fail(format!(
                    "results differ\n want: {}\n  got: {}",
                    serde_json::to_string(&want).unwrap(),
                    serde_json::to_string(&got).unwrap()
                ));
            }
            Ok(())
        }
        (Expect::Unsatisfiable, Ok(Outcome::Unsatisfiable(_))) => Ok(()),
        (Expect::UnsatisfiableBecause(text), Ok(Outcome::Unsatisfiable(u))) => {
            let all = u.to_string();
            if all.contains(text) {
                Ok(())
            } else {
                fail(format!("explanation lacks {text:?}:\n{all}"))
            }
        }
        (Expect::Error(text), Err(e)) if e.to_string().contains(text) => Ok(()),
        (_, Ok(Outcome::Allocated(a))) => fail(format!(
            "unexpected allocation {}",
            serde_json::to_string(&a.claims.iter().map(|c| &c.result).collect::<Vec<_>>()).unwrap()
        )),
        (_, Ok(Outcome::Unsatisfiable(u))) => fail(format!("unexpectedly unsatisfiable:\n{u}")),
        (_, Err(e)) => fail(format!("unexpected error: {e}")),
    }
}

/// Runs every case and reports all failures at once.
pub fn run(cases: Vec<Case>) {
    let mut names = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case name {}", case.name);
        if let Err(f) = check(case) {
            failures.push(f);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
