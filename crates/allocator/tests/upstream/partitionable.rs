//! Upstream cases: partitionable devices (shared counters, per-device node selection), plus the
//! 1.34 form where counters and devices share a slice.

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

use crate::support::*;

const REQ0_SUB1: &str = "req-0/subReq-1";
const REQ1_SUB1: &str = "req-1/subReq-1";

fn mem_device(name: &str, memory: &str, from_counters: bool) -> Device {
    consuming(
        device(name),
        COUNTER_SET1,
        &[("memory", memory)],
        from_counters,
    )
}

fn counters(
    name: &str,
    on: On,
    pool_: k8s_openapi::api::resource::v1::ResourcePool,
    memory: &str,
) -> ResourceSlice {
    counter_slice(
        name,
        on,
        pool_,
        DRIVER_A,
        &[(COUNTER_SET1, &[("memory", memory)])],
    )
}

fn sub_mem(name: &str, at_least: &str) -> k8s_openapi::api::resource::v1::DeviceSubRequest {
    sub_with(name, CLASS_A, 1, |s| {
        s.selectors = Some(vec![memory_at_least(at_least)])
    })
}

fn three_partitions() -> Vec<ResourceSlice> {
    vec![
        slice(
            SLICE1,
            On::Node(NODE1),
            pool(POOL1, 2),
            DRIVER_A,
            vec![
                mem_device(DEVICE1, "4Gi", true),
                mem_device(DEVICE2, "6Gi", true),
                mem_device(DEVICE3, "4Gi", true),
            ],
        ),
        counters(SLICE2, On::Node(NODE1), pool(POOL1, 2), "8Gi"),
    ]
}

pub fn cases() -> Vec<Case> {
    [
        counter_consumption_cases(),
        counter_set_cases(),
        exhausted_counter_cases(),
        per_device_node_selection_cases(),
        counter_set_reference_cases(),
        counter_reference_cases(),
        cross_node_counter_cases(),
        slice_validation_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Partitionable devices consuming shared counters: one device, all devices, a prioritized list.
fn counter_consumption_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-single-device",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "4Gi", false)],
                ),
                counters(SLICE2, On::Node(NODE1), pool(POOL1, 2), "8Gi"),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "all-devices-with-consumed-counters",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "4Gi", false)],
                ),
                counters(SLICE2, On::Node(NODE1), pool(POOL1, 2), "8Gi"),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-prioritized-list",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request(REQ0, CLASS_A, 1),
                    first_available(REQ1, vec![sub_mem(SUB0, "6Gi"), sub_mem(SUB1, "4Gi")]),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: three_partitions(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE3),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Several partitions of one counter set, and counters no device consumes.
fn counter_set_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-multiple-devices",
            claims: vec![claim(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1), request(REQ1, CLASS_A, 1)],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: three_partitions(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1, DRIVER_A, POOL1, DEVICE3),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-unused-counters-in-counter-set",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE1, "5Gi", false),
                        mem_device(DEVICE2, "4Gi", false),
                        mem_device(DEVICE3, "4Gi", false),
                    ],
                ),
                counter_slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    &[(COUNTER_SET1, &[("memory", "8Gi"), ("unused", "1Gi")])],
                ),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    result(REQ0, DRIVER_A, POOL1, DEVICE3),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Counter sets that are overallocated or have nothing left.
fn exhausted_counter_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-overallocated-capacity-pool",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE1, "4Gi", true),
                        mem_device(DEVICE2, "20Gi", true),
                    ],
                ),
                counters(SLICE2, On::Node(NODE1), pool(POOL1, 2), "18Gi"),
            ],
            expect: Expect::UnsatisfiableBecause(
                "shared counter counter-set-1/memory of its pool used up: driver-a/pool-1/device-1",
            ),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-no-capacity-available",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE1, "4Gi", true),
                        mem_device(DEVICE2, "16Gi", true),
                    ],
                ),
                counters(SLICE2, On::Node(NODE1), pool(POOL1, 2), "18Gi"),
            ],
            expect: Expect::UnsatisfiableBecause(
                "shared counter counter-set-1/memory of its pool used up",
            ),
            ..Default::default()
        },
    ]
}

/// Per-device node selection: by node name and by node selector.
fn per_device_node_selection_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-per-device-node-selection-nodename",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub_mem(SUB0, "6Gi"), sub_mem(SUB1, "4Gi")],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::PerDevice,
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![
                        with(mem_device(DEVICE1, "4Gi", true), |d| {
                            d.node_name = Some(NODE1.into())
                        }),
                        with(mem_device(DEVICE2, "6Gi", true), |d| {
                            d.node_name = Some(NODE2.into())
                        }),
                    ],
                ),
                counters(SLICE2, On::PerDevice, pool(POOL1, 2), "18Gi"),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-per-device-node-selection-node-selector",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::PerDevice,
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![with(mem_device(DEVICE1, "4Gi", true), |d| {
                        d.node_selector = Some(label_selector("region", &[REGION1]))
                    })],
                ),
                counters(SLICE2, On::PerDevice, pool(POOL1, 2), "18Gi"),
            ],
            expect: Expect::Results(vec![allocation(
                Some(label_selector("region", &[REGION1])),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
    ]
}

/// Which counter set a device refers to: one name in several slices, an unknown set.
fn counter_set_reference_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-same-counter-set-name-in-different-resource-slices",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 4),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                counter_slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 4),
                    DRIVER_A,
                    &[(COUNTER_SET1, &[])],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE1),
                    pool(POOL1, 4),
                    DRIVER_A,
                    vec![device(DEVICE2)],
                ),
                counter_slice(
                    SLICE4,
                    On::Node(NODE1),
                    pool(POOL1, 4),
                    DRIVER_A,
                    &[(COUNTER_SET1, &[])],
                ),
            ],
            expect: Expect::UnsatisfiableBecause("duplicate counter set name counter-set-1"),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-device-counter-consumption-references-unknown-counter-set",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![consuming(device(DEVICE1), COUNTER_SET2, &[], false)],
                ),
                counter_slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    &[(COUNTER_SET1, &[])],
                ),
            ],
            expect: Expect::UnsatisfiableBecause("counter set counter-set-2 not found"),
            ..Default::default()
        },
    ]
}

/// A device refers to an unknown counter, or to a counter set of another pool.
fn counter_reference_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-device-counter-consumption-references-unknown-counter-in-counter-set",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "8Gi", false)],
                ),
                counter_slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    &[(COUNTER_SET1, &[("other-memory", "8Gi")])],
                ),
            ],
            expect: Expect::UnsatisfiableBecause(
                "counter memory not found in counter set counter-set-1",
            ),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-device-counter-consumption-references-counter-set-in-other-pool",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                node_slice(
                    SLICE1,
                    NODE1,
                    POOL1,
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "8Gi", false)],
                ),
                counters(SLICE2, On::Node(NODE1), pool(POOL2, 1), "8Gi"),
            ],
            expect: Expect::UnsatisfiableBecause(
                "pool driver-a/pool-1 is invalid (counter set counter-set-1 not found)",
            ),
            ..Default::default()
        },
    ]
}

/// Devices on different nodes sharing one counter set.
fn cross_node_counter_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-devices-on-different-nodes-consume-same-counter-set",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub_mem(SUB0, "6Gi"), sub_mem(SUB1, "2Gi")],
                )],
            )],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE3)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                counters(SLICE1, On::Node(NODE1), pool(POOL1, 3), "8Gi"),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE1, "6Gi", true),
                        mem_device(DEVICE2, "2Gi", true),
                    ],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE2),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![mem_device(DEVICE3, "6Gi", false)],
                ),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE2)],
            )]),
            ..Default::default()
        },
        Case {
            name: "partitionable-devices-devices-consume-counter-set-in-different-nodes",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                counters(SLICE1, On::Node(NODE1), pool(POOL1, 3), "8Gi"),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "6Gi", true)],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE2),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE2, "6Gi", true),
                        mem_device(DEVICE3, "2Gi", true),
                    ],
                ),
            ],
            node: node(NODE2, REGION1),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE2)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE3)],
            )]),
        },
    ]
}

/// Validation of a slice that targets no node, and counters published in the device's own slice.
fn slice_validation_cases() -> Vec<Case> {
    vec![
        Case {
            name: "partitionable-devices-validation-error-on-non-targeting-slice",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                counters(SLICE1, On::Node(NODE1), pool(POOL1, 3), "8Gi"),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![mem_device(DEVICE1, "6Gi", true)],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE2),
                    pool(POOL1, 3),
                    DRIVER_A,
                    vec![consuming(
                        device(DEVICE3),
                        COUNTER_SET2,
                        &[("memory", "6Gi")],
                        false,
                    )],
                ),
            ],
            expect: Expect::UnsatisfiableBecause("counter set counter-set-2 not found"),
            ..Default::default()
        },
        // Not upstream's: the 1.34 form, where a slice carries both its devices and their counter
        // sets. Upstream (and so Tessera) takes such a slice as a counter slice only.
        Case {
            name: "tessera-partitionable-devices-counters-in-the-same-slice",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![with(
                node_slice(
                    SLICE1,
                    NODE1,
                    POOL1,
                    DRIVER_A,
                    vec![
                        mem_device(DEVICE1, "6Gi", true),
                        mem_device(DEVICE2, "4Gi", true),
                        mem_device(DEVICE3, "4Gi", true),
                    ],
                ),
                |s| {
                    s.spec.shared_counters =
                        counters(SLICE1, On::Node(NODE1), pool(POOL1, 1), "8Gi")
                            .spec
                            .shared_counters
                },
            )],
            // Upstream (since 1.35) takes a slice with counter sets as a counter slice only and
            // ignores its devices, and so do we.
            expect: Expect::UnsatisfiableBecause("no devices"),
            ..Default::default()
        },
    ]
}
