//! The reference on instances whose answers are worked out by hand, on the adversarial shapes,
//! and pruned against plain on generated instances (selector verdicts from `tessera-cel`).

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements, Counter, CounterSet,
    Device, DeviceCapacity, DeviceClaim, DeviceConstraint, DeviceCounterConsumption, DeviceRequest,
    DeviceSubRequest, DeviceTaint, DeviceToleration, ResourceClaim, ResourceClaimSpec,
    ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_test_support::objects::{cel_class, cel_selector, exact_request, int_attr};

use super::quantity::Nanos;
use super::*;
use crate::generate::adversarial::{SHAPES, adversarial_instance};
use crate::generate::{Generator, Switches};

fn device(i: i64) -> Device {
    Device {
        name: format!("dev-{i}"),
        attributes: Some(
            [
                ("index".to_owned(), int_attr(i)),
                ("numa".to_owned(), int_attr(i % 2)),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

fn slice(name: &str, pool: &str, node: &str, devices: Vec<Device>) -> ResourceSlice {
    let mut s = ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    s.spec.driver = "driver-a".into();
    s.spec.pool.name = pool.into();
    s.spec.pool.generation = 1;
    s.spec.pool.resource_slice_count = 1;
    s.spec.node_name = Some(node.into());
    s.spec.devices = Some(devices);
    s
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn claim(
    name: &str,
    requests: Vec<DeviceRequest>,
    constraints: Vec<DeviceConstraint>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                constraints: (!constraints.is_empty()).then_some(constraints),
                config: None,
            }),
        }),
        status: None,
    }
}

fn with_selector(mut r: DeviceRequest, expression: &str) -> DeviceRequest {
    r.exactly.as_mut().unwrap().selectors = Some(vec![cel_selector(expression)]);
    r
}

/// One node with `devices`, the class `class-a` (every driver-a device) and `claims`.
fn instance(devices: Vec<Device>, claims: Vec<ResourceClaim>) -> Instance {
    Instance {
        name: "case".into(),
        nodes: vec![node("node-1")],
        slices: vec![slice("s", "pool", "node-1", devices)],
        classes: vec![cel_class("class-a", "device.driver == \"driver-a\"")],
        claims,
        ..Default::default()
    }
}

fn decide_plainly(i: &Instance) -> Verdict {
    let options = Options {
        budget: 1_000_000,
        prune: false,
    };
    decide(i, &SelectorTable::tessera(i), options)
        .unwrap()
        .verdict
}

/// Each claim's devices, as `request=device`.
fn devices(v: &Verdict) -> Vec<Vec<String>> {
    v.allocations
        .iter()
        .map(|a| {
            a.devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| format!("{}={}", r.request, r.device))
                .collect()
        })
        .collect()
}

#[test]
fn first_fit_tries_combinations_in_order_and_takes_the_first_that_completes() {
    let i = instance(
        (0..4).map(device).collect(),
        vec![claim(
            "c",
            vec![
                exact_request("req-0", "class-a", 2),
                with_selector(
                    exact_request("req-1", "class-a", 1),
                    "device.attributes[\"driver-a\"].index == 0",
                ),
            ],
            vec![],
        )],
    );
    let v = decide_plainly(&i);
    assert_eq!(v.outcome, VerdictKind::Allocated);
    assert_eq!(devices(&v), [["req-0=dev-1", "req-0=dev-2", "req-1=dev-0"]]);
}

#[test]
fn subrequests_are_tried_in_order() {
    let sub = |name: &str, count: i64| DeviceSubRequest {
        name: name.into(),
        device_class_name: "class-a".into(),
        allocation_mode: Some("ExactCount".into()),
        count: Some(count),
        ..Default::default()
    };
    let request = DeviceRequest {
        name: "req-0".into(),
        exactly: None,
        first_available: Some(vec![sub("big", 3), sub("small", 1)]),
    };
    let v = decide_plainly(&instance(
        (0..2).map(device).collect(),
        vec![claim("c", vec![request], vec![])],
    ));
    assert_eq!(devices(&v), [["req-0/small=dev-0"]]);
}

#[test]
fn constraints_compare_the_named_attribute() {
    let matching = DeviceConstraint {
        match_attribute: Some("driver-a/numa".into()),
        distinct_attribute: None,
        requests: None,
    };
    let requests = || {
        vec![
            exact_request("req-0", "class-a", 1),
            exact_request("req-1", "class-a", 1),
        ]
    };
    let v = decide_plainly(&instance(
        (0..3).map(device).collect(),
        vec![claim("c", requests(), vec![matching])],
    ));
    assert_eq!(
        devices(&v),
        [["req-0=dev-0", "req-1=dev-2"]],
        "numa 0 twice"
    );
    let distinct = DeviceConstraint {
        match_attribute: None,
        distinct_attribute: Some("driver-a/numa".into()),
        requests: Some(vec!["req-1".into(), "req-2".into()]),
    };
    let mut three = requests();
    three.push(exact_request("req-2", "class-a", 1));
    let v = decide_plainly(&instance(
        (0..4).map(device).collect(),
        vec![claim("c", three, vec![distinct])],
    ));
    assert_eq!(devices(&v), [["req-0=dev-0", "req-1=dev-1", "req-2=dev-2"]]);
    let missing = DeviceConstraint {
        match_attribute: Some("driver-a/nothing".into()),
        distinct_attribute: None,
        requests: None,
    };
    let v = decide_plainly(&instance(
        (0..3).map(device).collect(),
        vec![claim("c", requests(), vec![missing])],
    ));
    assert_eq!(v.outcome, VerdictKind::Unsatisfiable);
}

#[test]
fn a_pools_counters_hold_what_its_devices_consume_together() {
    let consuming = |i: i64| Device {
        consumes_counters: Some(vec![DeviceCounterConsumption {
            compatibility_groups: None,
            counter_set: "set".into(),
            counters: [(
                "sm".to_owned(),
                Counter {
                    value: Quantity("3".into()),
                },
            )]
            .into(),
        }]),
        ..device(i)
    };
    let mut i = instance(
        (0..3).map(consuming).collect(),
        vec![claim(
            "c",
            vec![exact_request("req-0", "class-a", 2)],
            vec![],
        )],
    );
    let mut counters = slice("t", "pool", "node-1", Vec::new());
    counters.spec.devices = None;
    counters.spec.shared_counters = Some(vec![CounterSet {
        name: "set".into(),
        counters: [(
            "sm".to_owned(),
            Counter {
                value: Quantity("4".into()),
            },
        )]
        .into(),
    }]);
    i.slices.push(counters);
    for s in &mut i.slices {
        s.spec.pool.resource_slice_count = 2;
    }
    assert_eq!(decide_plainly(&i).outcome, VerdictKind::Unsatisfiable);
    i.claims = vec![claim(
        "c",
        vec![exact_request("req-0", "class-a", 1)],
        vec![],
    )];
    assert_eq!(devices(&decide_plainly(&i)), [["req-0=dev-0"]]);
    i.slices.pop();
    let v = decide_plainly(&i);
    assert_eq!(v.outcome, VerdictKind::Unsatisfiable, "incomplete pool");
}

#[test]
fn shares_consume_capacity_rounded_up_by_the_policy() {
    let multi = Device {
        allow_multiple_allocations: Some(true),
        capacity: Some(
            [(
                "memory".to_owned(),
                DeviceCapacity {
                    value: Quantity("4Gi".into()),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity("1Gi".into())),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: Quantity("1Gi".into()),
                            max: None,
                            step: Some(Quantity("1Gi".into())),
                        }),
                        valid_values: None,
                    }),
                },
            )]
            .into(),
        ),
        ..device(0)
    };
    let asking = |name: &str| {
        let mut r = exact_request("req-0", "class-a", 1);
        r.exactly.as_mut().unwrap().capacity = Some(CapacityRequirements {
            requests: Some([("memory".to_owned(), Quantity("1536Mi".into()))].into()),
        });
        claim(name, vec![r], vec![])
    };
    let two = instance(vec![multi.clone()], vec![asking("a"), asking("b")]);
    let v = decide_plainly(&two);
    assert_eq!(v.outcome, VerdictKind::Allocated);
    let consumed = v.allocations[1]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0]
        .consumed_capacity
        .clone()
        .unwrap();
    assert_eq!(Nanos::of(&consumed["memory"]), Nanos::parse("2Gi"));
    let three = instance(vec![multi], vec![asking("a"), asking("b"), asking("c")]);
    assert_eq!(decide_plainly(&three).outcome, VerdictKind::Unsatisfiable);
}

#[test]
fn only_untolerated_scheduling_taints_exclude_a_device() {
    let tainted = |i: i64, effect: &str| Device {
        taints: Some(vec![DeviceTaint {
            key: "k".into(),
            value: None,
            effect: effect.into(),
            time_added: None,
        }]),
        ..device(i)
    };
    let one = || claim("c", vec![exact_request("req-0", "class-a", 1)], vec![]);
    let v = decide_plainly(&instance(
        vec![tainted(0, "NoSchedule"), tainted(1, "None")],
        vec![one()],
    ));
    assert_eq!(devices(&v), [["req-0=dev-1"]]);
    let mut tolerant = exact_request("req-0", "class-a", 1);
    tolerant.exactly.as_mut().unwrap().tolerations = Some(vec![DeviceToleration {
        key: Some("k".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    let v = decide_plainly(&instance(
        vec![tainted(0, "NoExecute")],
        vec![claim("c", vec![tolerant], vec![])],
    ));
    assert_eq!(devices(&v), [["req-0=dev-0"]]);
}

#[test]
fn a_selector_error_counts_only_where_first_fit_evaluates() {
    let bare = |i: i64| Device {
        name: format!("dev-{i}"),
        ..Default::default()
    };
    let risky = || {
        claim(
            "c",
            vec![with_selector(
                exact_request("req-0", "class-a", 1),
                "device.attributes[\"driver-a\"].numa == 0",
            )],
            vec![],
        )
    };
    // dev-0 fits before first fit reaches dev-1, which has no numa attribute.
    let v = decide_plainly(&instance(vec![device(0), bare(1)], vec![risky()]));
    assert_eq!(devices(&v), [["req-0=dev-0"]]);
    // The other way round, the first device tried fails to evaluate.
    let v = decide_plainly(&instance(vec![bare(1), device(0)], vec![risky()]));
    assert_eq!(
        (v.outcome, v.error_class.as_deref()),
        (VerdictKind::Error, Some("cel-runtime"))
    );
    // A device in use is not evaluated.
    let mut i = instance(vec![bare(1), device(0)], vec![risky()]);
    i.state = Some(crate::instance::ExplicitState {
        devices: vec![crate::instance::DeviceRef {
            driver: "driver-a".into(),
            pool: "pool".into(),
            device: "dev-1".into(),
        }],
        ..Default::default()
    });
    assert_eq!(devices(&decide_plainly(&i)), [["req-0=dev-0"]]);
}

#[test]
fn admin_access_takes_devices_in_use() {
    let mut i = instance(vec![device(0)], Vec::new());
    i.state = Some(crate::instance::ExplicitState {
        devices: vec![crate::instance::DeviceRef {
            driver: "driver-a".into(),
            pool: "pool".into(),
            device: "dev-0".into(),
        }],
        ..Default::default()
    });
    i.claims = vec![claim(
        "c",
        vec![exact_request("req-0", "class-a", 1)],
        vec![],
    )];
    assert_eq!(decide_plainly(&i).outcome, VerdictKind::Unsatisfiable);
    let mut admin = exact_request("req-0", "class-a", 1);
    admin.exactly.as_mut().unwrap().admin_access = Some(true);
    i.claims = vec![claim("c", vec![admin], vec![])];
    let v = decide_plainly(&i);
    assert_eq!(devices(&v), [["req-0=dev-0"]]);
    let result = &v.allocations[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(result.admin_access, Some(true));
}

#[test]
fn all_takes_every_match_and_needs_every_pool_usable() {
    let mut all = exact_request("req-0", "class-a", 1);
    let e = all.exactly.as_mut().unwrap();
    e.allocation_mode = Some("All".into());
    e.count = None;
    let mut i = instance(
        (0..3).map(device).collect(),
        vec![claim("c", vec![all], vec![])],
    );
    assert_eq!(
        devices(&decide_plainly(&i)),
        [["req-0=dev-0", "req-0=dev-1", "req-0=dev-2"]]
    );
    let mut incomplete = slice("u", "other", "node-1", vec![device(7)]);
    incomplete.spec.pool.resource_slice_count = 2;
    i.slices.push(incomplete);
    let v = decide_plainly(&i);
    assert_eq!(
        (v.outcome, v.error_class.as_deref()),
        (VerdictKind::Error, Some("all-pool-unusable"))
    );
}

#[test]
fn every_adversarial_shape_is_decided_quickly_with_the_answer_its_table_gives() {
    for shape in SHAPES {
        for second_node in [false, true] {
            let (n, k) = (40, 12);
            let i =
                adversarial_instance(format!("{shape}-{second_node}"), shape, n, k, second_node);
            let d = decide(&i, &SelectorTable::tessera(&i), Options::for_instance(&i)).unwrap();
            assert!(
                d.most_trials < 10_000,
                "{shape}: {} devices tried",
                d.most_trials
            );
            let node_1 = &d.verdict.nodes[0];
            if shape == "late-fit" {
                let mut want: Vec<String> = (1..=k).map(|x| format!("req-0=dev-{x}")).collect();
                want.push("req-1=dev-0".into());
                assert_eq!(node_1.outcome, VerdictKind::Allocated, "{shape}");
                assert_eq!(devices(&d.verdict), [want], "{shape}");
            } else {
                assert_eq!(node_1.outcome, VerdictKind::Unsatisfiable, "{shape}");
                let fits_elsewhere = second_node && shape == "in-use";
                assert_eq!(
                    d.verdict.outcome,
                    if fits_elsewhere {
                        VerdictKind::Allocated
                    } else {
                        VerdictKind::Unsatisfiable
                    },
                    "{shape}, second node {second_node}"
                );
            }
        }
    }
}

#[test]
fn pruning_changes_no_answer() {
    let mut g = Generator::new(11, Switches::all());
    let mut compared = 0;
    let mut pruned = 0;
    while compared < 150 {
        let i = g.instance();
        if i.adversarial {
            continue;
        }
        let table = SelectorTable::tessera(&i);
        let plain = decide(
            &i,
            &table,
            Options {
                budget: 200_000,
                prune: false,
            },
        );
        let with = decide(
            &i,
            &table,
            Options {
                budget: 200_000,
                prune: true,
            },
        );
        let (Ok(plain), Ok(with)) = (plain, with) else {
            continue;
        };
        compared += 1;
        pruned += u64::from(with.most_trials < plain.most_trials);
        assert_eq!(
            crate::compare::compare(&with.verdict, &plain.verdict),
            Vec::new(),
            "{}",
            i.name
        );
    }
    assert!(
        pruned > 10,
        "pruning cut the walk on only {pruned} instances"
    );
}

#[test]
fn an_unreadable_quantity_is_beyond_reach() {
    let mut d = device(0);
    d.capacity = Some(
        [(
            "memory".to_owned(),
            DeviceCapacity {
                value: Quantity("1e3".into()),
                request_policy: None,
            },
        )]
        .into(),
    );
    let i = instance(
        vec![d],
        vec![claim(
            "c",
            vec![exact_request("req-0", "class-a", 1)],
            vec![],
        )],
    );
    let err = decide(&i, &SelectorTable::tessera(&i), Options::for_instance(&i)).unwrap_err();
    assert!(err.0.contains("1e3"), "{err}");
}
