//! Upstream cases: simple allocation, nodes, slices and pools, classes, limits, network-attached
//! devices, combinations.

use crate::support::*;

pub fn cases() -> Vec<Case> {
    [
        simple_cases(),
        backtracking_cases(),
        slice_cases(),
        missing_input_cases(),
        network_attached_cases(),
        many_network_attached_cases(),
        mixed_source_cases(),
        invalid_request_cases(),
        device_limit_cases(),
        multi_host_pool_cases(),
        invalid_pool_cases(),
        incomplete_pool_and_combination_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One claim on one node: the plain path, another node, devices chosen by size.
fn simple_cases() -> Vec<Case> {
    vec![
        Case {
            name: "simple",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "other-node",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                node_slice(SLICE1, NODE1, POOL1, DRIVER_B, vec![device(DEVICE1)]),
                node_slice(SLICE2, NODE2, POOL2, DRIVER_A, vec![device(DEVICE1)]),
            ],
            node: node(NODE2, REGION2),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE2)),
                vec![result(REQ0, DRIVER_A, POOL2, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "small-and-large",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request_with(REQ0, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("1Gi")])
                    }),
                    request_with(REQ1, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("2Gi")])
                    }),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    capacity(device(DEVICE1), &[("memory", "1Gi")]),
                    capacity(device(DEVICE2), &[("memory", "2Gi")]),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1, DRIVER_A, POOL1, DEVICE2),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Requests and claims that fit only once the allocator goes back on an earlier choice.
fn backtracking_cases() -> Vec<Case> {
    vec![
        Case {
            name: "small-and-large-backtrack-requests",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request_with(REQ0, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("1Gi")])
                    }),
                    request_with(REQ1, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("2Gi")])
                    }),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    capacity(device(DEVICE2), &[("memory", "2Gi")]),
                    capacity(device(DEVICE1), &[("memory", "1Gi")]),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1, DRIVER_A, POOL1, DEVICE2),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "small-and-large-backtrack-claims",
            claims: vec![
                claim(
                    CLAIM0,
                    vec![request_with(REQ0, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("1Gi")])
                    })],
                ),
                claim(
                    CLAIM1,
                    vec![request_with(REQ1, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![memory_at_least("2Gi")])
                    })],
                ),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    capacity(device(DEVICE2), &[("memory", "2Gi")]),
                    capacity(device(DEVICE1), &[("memory", "1Gi")]),
                ],
            )],
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![result(REQ1, DRIVER_A, POOL1, DEVICE2)],
                ),
            ]),
            ..Default::default()
        },
    ]
}

/// Devices spread over slices, and slices left over from an older generation or published twice.
fn slice_cases() -> Vec<Case> {
    vec![
        Case {
            name: "devices-split-across-different-slices",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                one_device_slice(SLICE1, POOL1, DRIVER_A),
                one_device_slice(SLICE2, POOL2, DRIVER_A),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ0, DRIVER_A, POOL2, DEVICE1),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "obsolete-slice",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    "slice-1-obsolete",
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                with(
                    slice(
                        "slice-1-obsolete",
                        On::Node(NODE1),
                        pool(POOL1, 2),
                        DRIVER_A,
                        vec![device(DEVICE2)],
                    ),
                    |s| s.spec.pool.generation += 1,
                ),
            ],
            expect: Expect::UnsatisfiableBecause(
                "pool driver-a/pool-1 is incomplete (1 of 2 slices",
            ),
            ..Default::default()
        },
        Case {
            name: "duplicate-slice",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    "slice-1-2",
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
            ],
            expect: Expect::UnsatisfiableBecause(
                "pool driver-a/pool-1 is invalid (duplicate device name device-1)",
            ),
            ..Default::default()
        },
    ]
}

/// Nothing to allocate from or for: no slices, too few devices, missing or empty classes, no claims.
fn missing_input_cases() -> Vec<Case> {
    vec![
        Case {
            name: "no-slices",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            expect: Expect::UnsatisfiableBecause("no devices"),
            ..Default::default()
        },
        Case {
            name: "not-enough-suitable-devices",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM0, REQ1, CLASS_A),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::UnsatisfiableBecause("each request can be met on its own"),
            ..Default::default()
        },
        Case {
            name: "no-classes",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            // Upstream's allocator errors; kube-scheduler's PreFilter finds the missing class
            // first and marks the pod unschedulable, which is what first fit promises.
            expect: Expect::UnsatisfiableBecause("DeviceClass class-a does not exist"),
            ..Default::default()
        },
        Case {
            name: "unknown-class",
            claims: vec![simple_claim(CLAIM0, REQ0, "unknown-class")],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::UnsatisfiableBecause("DeviceClass unknown-class does not exist"),
            ..Default::default()
        },
        Case {
            name: "empty-class",
            claims: vec![simple_claim(CLAIM0, REQ0, "")],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error(
                "claim claim-0, request req-0: missing device class name (unsupported request type?)",
            ),
            ..Default::default()
        },
        Case {
            name: "no-claims-to-allocate",
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![]),
            ..Default::default()
        },
    ]
}

/// A network-attached device (a slice for a set of nodes), reachable or not.
fn network_attached_cases() -> Vec<Case> {
    vec![
        Case {
            name: "network-attached-device",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![slice(
                SLICE1,
                On::Selector(label_selector("region", &[REGION1])),
                pool(POOL1, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            )],
            expect: Expect::Results(vec![allocation(
                Some(label_selector("region", &[REGION1])),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "unsuccessful-allocation-network-attached-device",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![slice(
                SLICE1,
                On::Selector(label_selector("region", &[REGION1])),
                pool(POOL1, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            )],
            node: node(NODE2, REGION2),
            expect: Expect::UnsatisfiableBecause("no devices"),
            ..Default::default()
        },
    ]
}

/// Many network-attached devices across slices.
fn many_network_attached_cases() -> Vec<Case> {
    vec![Case {
        name: "many-network-attached-devices",
        claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 4)])],
        classes: vec![class(CLASS_A, DRIVER_A)],
        slices: vec![
            slice(
                SLICE1,
                On::Selector(label_selector("region", &[REGION1])),
                pool(POOL1, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            ),
            slice(
                SLICE1,
                On::All,
                pool(POOL2, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            ),
            slice(
                SLICE1,
                On::Selector(label_selector("planet", &["earth"])),
                pool(POOL3, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            ),
            slice(
                SLICE1,
                On::Selector(local(NODE1)),
                pool(POOL4, 1),
                DRIVER_A,
                vec![device(DEVICE1)],
            ),
        ],
        expect: Expect::Results(vec![allocation(
            Some(k8s_openapi::api::core::v1::NodeSelector {
                node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
                    match_expressions: Some(vec![
                        label_selector("region", &[REGION1]).node_selector_terms[0]
                            .match_expressions
                            .clone()
                            .unwrap()[0]
                            .clone(),
                        label_selector("planet", &["earth"]).node_selector_terms[0]
                            .match_expressions
                            .clone()
                            .unwrap()[0]
                            .clone(),
                    ]),
                    match_fields: local(NODE1).node_selector_terms[0].match_fields.clone(),
                }],
            }),
            vec![
                result(REQ0, DRIVER_A, POOL1, DEVICE1),
                result(REQ0, DRIVER_A, POOL2, DEVICE1),
                result(REQ0, DRIVER_A, POOL3, DEVICE1),
                result(REQ0, DRIVER_A, POOL4, DEVICE1),
            ],
        )]),
        ..Default::default()
    }]
}

/// Devices from several places at once: local and network-attached, several drivers, some already allocated.
fn mixed_source_cases() -> Vec<Case> {
    vec![
        Case {
            name: "local-and-network-attached-devices",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 2)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Selector(label_selector("region", &[REGION1])),
                    pool(POOL1, 1),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                node_slice(SLICE1, NODE1, POOL2, DRIVER_A, vec![device(DEVICE1)]),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ0, DRIVER_A, POOL2, DEVICE1),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "several-different-drivers",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM0, REQ0, CLASS_B),
            ],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![
                node_slice(
                    SLICE1,
                    NODE1,
                    POOL1,
                    DRIVER_A,
                    vec![device(DEVICE1), device(DEVICE2)],
                ),
                one_device_slice(SLICE1, POOL1, DRIVER_B),
            ],
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![result(REQ0, DRIVER_B, POOL1, DEVICE1)],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "already-allocated-devices",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1), (DRIVER_A, POOL1, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::UnsatisfiableBecause(
                "in use by another claim: driver-a/pool-1/device-1",
            ),
            ..Default::default()
        },
    ]
}

/// Requests the allocator cannot read: an unknown selector or allocation mode, CEL that does not compile.
fn invalid_request_cases() -> Vec<Case> {
    vec![
        Case {
            name: "unknown-selector",
            claims: vec![claim(
                CLAIM0,
                vec![request_with(REQ0, CLASS_A, 1, |r| {
                    r.selectors = Some(vec![k8s_openapi::api::resource::v1::DeviceSelector {
                        cel: None,
                    }])
                })],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("CEL expression empty (unsupported selector type?)"),
            ..Default::default()
        },
        Case {
            name: "unknown-allocation-mode",
            claims: vec![claim(
                CLAIM0,
                vec![request_with(REQ0, CLASS_A, 1, |r| {
                    r.allocation_mode = Some("future-mode".into())
                })],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("unsupported count mode future-mode"),
            ..Default::default()
        },
        Case {
            name: "invalid-CEL-one-device",
            claims: vec![claim(
                CLAIM0,
                vec![request_with(REQ0, CLASS_A, 1, |r| {
                    r.selectors = Some(vec![selector("noSuchVar")])
                })],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("claim claim-0, request req-0: selector #0: CEL compile error"),
            ..Default::default()
        },
        Case {
            name: "invalid-CEL-one-device-class",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class_with_selectors(CLASS_A, vec![selector("noSuchVar")])],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("class class-a: selector #0: CEL compile error"),
            ..Default::default()
        },
        Case {
            name: "invalid-CEL-all-devices",
            claims: vec![claim(
                CLAIM0,
                vec![with(all_request(REQ0, CLASS_A), |r| {
                    r.exactly.as_mut().unwrap().selectors = Some(vec![selector("noSuchVar")])
                })],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("CEL compile error"),
            ..Default::default()
        },
    ]
}

/// The limit on devices per request and per claim.
fn device_limit_cases() -> Vec<Case> {
    vec![
        Case {
            name: "too-many-devices-single-request",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 500)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            expect: Expect::Error("exceeds the claim limit"),
            ..Default::default()
        },
        Case {
            name: "many-devices-okay",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 32)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "too-many-devices-total",
            claims: vec![claim(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 32), request(REQ1, CLASS_A, 1)],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(33))],
            expect: Expect::Error("exceeds the claim limit"),
            ..Default::default()
        },
        Case {
            name: "max-number-devices",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 32)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(32))],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                (0..32)
                    .map(|i| result(REQ0, DRIVER_A, POOL1, &format!("device-{i}")))
                    .collect(),
            )]),
            ..Default::default()
        },
    ]
}

/// A pool whose slices target different nodes, one of them stale.
fn multi_host_pool_cases() -> Vec<Case> {
    vec![
        Case {
            name: "multi-host-resource-pool-with-stale-slice-for-current-node",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                with(
                    slice(
                        SLICE2,
                        On::Node(NODE2),
                        pool(POOL1, 2),
                        DRIVER_A,
                        vec![device(DEVICE2)],
                    ),
                    |s| s.spec.pool.generation = 2,
                ),
            ],
            expect: Expect::UnsatisfiableBecause("no devices"),
            ..Default::default()
        },
        Case {
            name: "different-resourceslices-in-pool-can-target-different-nodes",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE2),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE2)],
                ),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE2)],
            )]),
            ..Default::default()
        },
    ]
}

/// An invalid pool: ignored when another device fits, an error when none does.
fn invalid_pool_cases() -> Vec<Case> {
    vec![
        Case {
            name: "invalid-pool-is-ok-if-devices-can-be-allocated-from-other",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE1),
                    pool(POOL2, 1),
                    DRIVER_A,
                    vec![device(DEVICE2)],
                ),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL2, DEVICE2)],
            )]),
            ..Default::default()
        },
        Case {
            name: "invalid-pool-is-error-if-no-other-device-can-be-allocated",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            allocated: allocated(&[(DRIVER_A, POOL2, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                slice(
                    SLICE1,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    SLICE2,
                    On::Node(NODE1),
                    pool(POOL1, 2),
                    DRIVER_A,
                    vec![device(DEVICE1)],
                ),
                slice(
                    SLICE3,
                    On::Node(NODE1),
                    pool(POOL2, 1),
                    DRIVER_A,
                    vec![device(DEVICE2)],
                ),
            ],
            expect: Expect::UnsatisfiableBecause("pool driver-a/pool-1 is invalid"),
            ..Default::default()
        },
    ]
}

/// An incomplete pool is not allocated from; combinations are searched across and within requests.
fn incomplete_pool_and_combination_cases() -> Vec<Case> {
    vec![
        Case {
            name: "no-allocation-from-incomplete-pools",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 1)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![slice(
                SLICE1,
                On::Node(NODE1),
                pool(POOL1, 2),
                DRIVER_A,
                vec![device(DEVICE1)],
            )],
            expect: Expect::UnsatisfiableBecause("is incomplete"),
            ..Default::default()
        },
        Case {
            name: "check-combinations-with-backtracking",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request(REQ1, CLASS_A, 2),
                    request_with(REQ2, CLASS_A, 1, |r| {
                        r.selectors = Some(vec![selector(
                            "device.attributes[\"driver-a\"].type == \"X\"",
                        )])
                    }),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    attrs(device(DEVICE1), &[("type", string_attr("X"))]),
                    attrs(device(DEVICE2), &[("type", string_attr("Y"))]),
                    attrs(device(DEVICE3), &[("type", string_attr("Y"))]),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ1, DRIVER_A, POOL1, DEVICE2),
                    result(REQ1, DRIVER_A, POOL1, DEVICE3),
                    result(REQ2, DRIVER_A, POOL1, DEVICE1),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "check-combinations-within-single-request-single-pool-single-slice",
            claims: vec![claim(CLAIM0, vec![request(REQ0, CLASS_A, 5)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(4))],
            expect: Expect::UnsatisfiableBecause("4 available — not enough"),
            ..Default::default()
        },
    ]
}
