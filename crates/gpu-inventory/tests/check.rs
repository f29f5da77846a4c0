//! Table tests of the ResourceSlice limit checker: one valid slice, one mutation per row, the
//! violated field expected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    DeviceTaint, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_gpu_inventory::{
    DeviceSource, MockSource, RenderOptions, ServerVersion, check_pool, check_slice, render_slices,
};

const V1_34: ServerVersion = ServerVersion::V1_34;
const V1_35: ServerVersion = ServerVersion::V1_35;

/// A valid one-device slice (dgx-h100's first GPU).
fn valid() -> ResourceSlice {
    let inv = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
    let mut slice = render_slices(&inv, &RenderOptions::new("node-1"))
        .unwrap()
        .remove(0);
    slice.spec.devices.as_mut().unwrap().truncate(1);
    slice
}

fn device(slice: &mut ResourceSlice) -> &mut Device {
    &mut slice.spec.devices.as_mut().unwrap()[0]
}

fn attributes(slice: &mut ResourceSlice) -> &mut BTreeMap<String, DeviceAttribute> {
    device(slice).attributes.as_mut().unwrap()
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn counters(names: impl IntoIterator<Item = String>) -> BTreeMap<String, Counter> {
    names
        .into_iter()
        .map(|n| {
            (
                n,
                Counter {
                    value: Quantity("1".into()),
                },
            )
        })
        .collect()
}

fn set(name: &str, n: usize) -> CounterSet {
    CounterSet {
        name: name.to_owned(),
        counters: counters((0..n).map(|i| format!("c-{i}"))),
    }
}

fn consume(set: &str, n: usize) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: set.to_owned(),
        counters: counters((0..n).map(|i| format!("c-{i}"))),
        ..DeviceCounterConsumption::default()
    }
}

fn taint(key: &str, effect: &str) -> DeviceTaint {
    DeviceTaint {
        key: key.to_owned(),
        effect: effect.to_owned(),
        ..DeviceTaint::default()
    }
}

fn copies(slice: &mut ResourceSlice, n: usize) {
    let template = device(slice).clone();
    slice.spec.devices = Some(
        (0..n)
            .map(|i| Device {
                name: format!("gpu-{i}"),
                ..template.clone()
            })
            .collect(),
    );
}

type Mutation = fn(&mut ResourceSlice);

#[test]
fn the_valid_slice_passes_on_every_server() {
    for server in [V1_34, V1_35, ServerVersion::new(1, 37)] {
        check_slice(&valid(), server).unwrap();
    }
}

/// A row of [`each_violation_is_reported_at_its_field`]: what is wrong, the server checked
/// against, the mutation of the valid slice that makes it wrong, and the field expected in the
/// violation.
type Violation = (&'static str, ServerVersion, Mutation, &'static str);

/// The slice's own fields: name, driver, pool, node selection.
fn slice_violations() -> Vec<Violation> {
    vec![
        (
            "bad slice name",
            V1_34,
            |s| s.metadata.name = Some("Node_1".into()),
            "metadata.name",
        ),
        (
            "no slice name",
            V1_34,
            |s| s.metadata.name = None,
            "metadata.name",
        ),
        (
            "bad driver",
            V1_34,
            |s| s.spec.driver = "GPU".into(),
            "spec.driver",
        ),
        (
            "long driver",
            V1_34,
            |s| s.spec.driver = format!("{}.dev", "a".repeat(60)),
            "spec.driver",
        ),
        (
            "bad pool name",
            V1_34,
            |s| s.spec.pool.name = "a//b".into(),
            "spec.pool.name",
        ),
        (
            "negative generation",
            V1_34,
            |s| s.spec.pool.generation = -1,
            "spec.pool.generation",
        ),
        (
            "zero slice count",
            V1_34,
            |s| s.spec.pool.resource_slice_count = 0,
            "spec.pool.resourceSliceCount",
        ),
        (
            "two node selections",
            V1_34,
            |s| s.spec.all_nodes = Some(true),
            "spec",
        ),
        (
            "no node selection",
            V1_34,
            |s| s.spec.node_name = None,
            "spec",
        ),
        (
            "selector and name",
            V1_34,
            |s| s.spec.node_selector = Some(NodeSelector::default()),
            "spec",
        ),
    ]
}

/// The device list and device names, and how many attributes and capacities one has.
fn device_violations() -> Vec<Violation> {
    vec![
        ("129 devices", V1_34, |s| copies(s, 129), "spec.devices"),
        (
            "65 tainted devices",
            V1_34,
            |s| {
                device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "NoSchedule")]);
                copies(s, 65);
            },
            "spec.devices",
        ),
        (
            "device name not a label",
            V1_34,
            |s| device(s).name = "GPU.0".into(),
            "spec.devices[0].name",
        ),
        (
            "duplicate device",
            V1_34,
            |s| {
                let d = device(s).clone();
                s.spec.devices.as_mut().unwrap().push(d);
            },
            "spec.devices[1].name",
        ),
        (
            "33 attributes and capacities",
            V1_34,
            |s| {
                for i in 0..20 {
                    attributes(s).insert(format!("extra{i}"), string("x"));
                }
            },
            "spec.devices[0]",
        ),
    ]
}

/// Attribute names and values.
fn attribute_violations() -> Vec<Violation> {
    vec![
        (
            "unqualified name with a dash",
            V1_34,
            |s| {
                attributes(s).insert("pcie-root".into(), string("x"));
            },
            "spec.devices[0].attributes[pcie-root]",
        ),
        (
            "identifier longer than 32",
            V1_34,
            |s| {
                attributes(s).insert(format!("gpu.tessera.dev/{}", "x".repeat(33)), string("x"));
            },
            "spec.devices[0].attributes[gpu.tessera.dev/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx]",
        ),
        (
            "string longer than 64",
            V1_34,
            |s| {
                attributes(s).insert("productName".into(), string(&"x".repeat(65)));
            },
            "spec.devices[0].attributes[productName]",
        ),
        (
            "version not semver",
            V1_34,
            |s| {
                attributes(s).get_mut("driverVersion").unwrap().version = Some("550.54.015".into());
            },
            "spec.devices[0].attributes[driverVersion]",
        ),
        (
            "two values",
            V1_34,
            |s| {
                attributes(s).get_mut("index").unwrap().bool = Some(true);
            },
            "spec.devices[0].attributes[index]",
        ),
    ]
}

/// Capacities and taints.
fn capacity_and_taint_violations() -> Vec<Violation> {
    vec![
        (
            "capacity not a quantity",
            V1_34,
            |s| {
                device(s).capacity.as_mut().unwrap().insert(
                    "memory".into(),
                    DeviceCapacity {
                        value: Quantity("80GB".into()),
                        ..DeviceCapacity::default()
                    },
                );
            },
            "spec.devices[0].capacity[memory].value",
        ),
        (
            "five taints in 1.34",
            V1_34,
            |s| device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "NoSchedule"); 5]),
            "spec.devices[0].taints",
        ),
        (
            "seventeen taints in 1.35",
            V1_35,
            |s| device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "NoSchedule"); 17]),
            "spec.devices[0].taints",
        ),
        (
            "effect None before 1.35",
            V1_34,
            |s| device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "None")]),
            "spec.devices[0].taints[0].effect",
        ),
        (
            "PreferNoSchedule",
            V1_35,
            |s| device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "PreferNoSchedule")]),
            "spec.devices[0].taints[0].effect",
        ),
        (
            "taint key",
            V1_35,
            |s| device(s).taints = Some(vec![taint("bad key", "NoSchedule")]),
            "spec.devices[0].taints[0].key",
        ),
    ]
}

/// Shared counter sets: how many, their names, their counters.
fn counter_set_violations() -> Vec<Violation> {
    vec![
        (
            "devices and counters together in 1.35",
            V1_35,
            |s| s.spec.shared_counters = Some(vec![set("gpu-0-counters", 2)]),
            "spec",
        ),
        (
            "nine counter sets in 1.35",
            V1_35,
            |s| {
                s.spec.devices = None;
                s.spec.shared_counters = Some((0..9).map(|i| set(&format!("s-{i}"), 1)).collect());
            },
            "spec.sharedCounters",
        ),
        (
            "33 counters in a set",
            V1_35,
            |s| {
                s.spec.devices = None;
                s.spec.shared_counters = Some(vec![set("s", 33)]);
            },
            "spec.sharedCounters[0].counters",
        ),
        (
            "33 counters over all sets in 1.34",
            V1_34,
            |s| s.spec.shared_counters = Some(vec![set("a", 17), set("b", 16)]),
            "spec.sharedCounters",
        ),
        (
            "counter set name not a label",
            V1_34,
            |s| s.spec.shared_counters = Some(vec![set("Set_A", 1)]),
            "spec.sharedCounters[0].name",
        ),
        (
            "counter name not a label",
            V1_34,
            |s| {
                let mut bad = set("a", 0);
                bad.counters = counters(["memory_slice".to_owned()]);
                s.spec.shared_counters = Some(vec![bad]);
            },
            "spec.sharedCounters[0].counters[memory_slice]",
        ),
    ]
}

/// What devices consume from counter sets, per-device node names and binding conditions.
fn consumption_violations() -> Vec<Violation> {
    vec![
        (
            "consumption of a set defined elsewhere in 1.34",
            V1_34,
            |s| device(s).consumes_counters = Some(vec![consume("elsewhere", 1)]),
            "spec.devices[0].consumesCounters[0].counterSet",
        ),
        (
            "consumption of an unknown counter in 1.34",
            V1_34,
            |s| {
                s.spec.shared_counters = Some(vec![set("a", 1)]);
                device(s).consumes_counters = Some(vec![consume("a", 2)]);
            },
            "spec.devices[0].consumesCounters[0].counters[c-1]",
        ),
        (
            "three consumptions in 1.35",
            V1_35,
            |s| {
                device(s).consumes_counters =
                    Some(vec![consume("a", 1), consume("b", 1), consume("c", 1)])
            },
            "spec.devices[0].consumesCounters",
        ),
        (
            "the same set twice",
            V1_35,
            |s| device(s).consumes_counters = Some(vec![consume("a", 1), consume("a", 1)]),
            "spec.devices[0].consumesCounters[1].counterSet",
        ),
        (
            "1025 consumed counters in 1.34",
            V1_34,
            |s| {
                s.spec.shared_counters = Some(vec![set("a", 32)]);
                device(s).consumes_counters = Some(vec![consume("a", 32)]);
                copies(s, 33);
            },
            "spec.devices",
        ),
        (
            "device node name without per-device selection",
            V1_34,
            |s| device(s).node_name = Some("node-1".into()),
            "spec.devices[0]",
        ),
        (
            "five binding conditions",
            V1_35,
            |s| device(s).binding_conditions = Some(vec!["x".into(); 5]),
            "spec.devices[0].bindingConditions",
        ),
    ]
}

#[test]
fn each_violation_is_reported_at_its_field() {
    let rows: Vec<Violation> = [
        slice_violations(),
        device_violations(),
        attribute_violations(),
        capacity_and_taint_violations(),
        counter_set_violations(),
        consumption_violations(),
    ]
    .into_iter()
    .flatten()
    .collect();
    for (what, server, mutate, field) in rows {
        let mut slice = valid();
        mutate(&mut slice);
        let violations = check_slice(&slice, server).expect_err(what);
        assert!(
            violations.iter().any(|v| v.field == field),
            "{what}: expected a violation at `{field}`, got {violations:#?}"
        );
    }
}

#[test]
fn limits_are_inclusive() {
    let rows: Vec<(&str, ServerVersion, Mutation)> = vec![
        ("128 plain devices", V1_34, |s| copies(s, 128)),
        ("64 tainted devices", V1_34, |s| {
            device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "NoSchedule"); 4]);
            copies(s, 64);
        }),
        ("32 counters in 1.34", V1_34, |s| {
            s.spec.shared_counters = Some(vec![set("a", 16), set("b", 16)]);
        }),
        ("eight sets of 32 in 1.35", V1_35, |s| {
            s.spec.devices = None;
            s.spec.shared_counters = Some((0..8).map(|i| set(&format!("s-{i}"), 32)).collect());
        }),
        ("two consumptions in 1.35", V1_35, |s| {
            device(s).consumes_counters = Some(vec![consume("a", 32), consume("b", 32)]);
        }),
        ("16 taints and effect None in 1.35", V1_35, |s| {
            device(s).taints = Some(vec![taint("gpu.tessera.dev/xid", "None"); 16]);
        }),
        ("string of 64", V1_34, |s| {
            attributes(s).insert("productName".into(), string(&"x".repeat(64)));
        }),
    ];
    for (what, server, mutate) in rows {
        let mut slice = valid();
        mutate(&mut slice);
        if let Err(violations) = check_slice(&slice, server) {
            panic!("{what}: {violations:#?}");
        }
    }
}

#[test]
fn pool_checks_span_slices() {
    let slice = valid();
    let mut second = valid();
    second.metadata.name = Some("node-1-gpu.tessera.dev-1".into());
    // Same device name in two slices, and each claims the pool has one slice.
    let violations = check_pool(&[slice.clone(), second.clone()]).unwrap_err();
    let messages: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        messages.iter().any(|m| m.contains("also in slices[0]")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("is 1, but the pool has 2 slices")),
        "{messages:?}"
    );
    // A consumed counter the pool does not define.
    let mut consuming = valid();
    device(&mut consuming).consumes_counters = Some(vec![consume("gpu-0-counters", 1)]);
    let violations = check_pool(&[consuming]).unwrap_err();
    assert!(
        violations[0]
            .message
            .contains("which the pool does not define")
    );
    check_pool(&[slice]).unwrap();
}
