//! Upstream cases: device taints and tolerations; consumable capacity with request policies.

use k8s_openapi::api::resource::v1::{
    Device, DeviceClass, DeviceRequest, DeviceTaint, DeviceToleration, ResourceSlice,
};
use tessera_allocator::quantity::Amount;
use tessera_allocator::{AllocatedState, DeviceId};

use crate::support::*;

const REQ0_SUB1: &str = "req-0/subReq-1";

fn no_schedule() -> DeviceTaint {
    taint("taint-key", "taint-value", "NoSchedule")
}

fn no_execute() -> DeviceTaint {
    taint("taint-key", "taint-value-2", "NoExecute")
}

fn tolerate_no_schedule() -> DeviceToleration {
    toleration("taint-key", "Exists", "", "NoSchedule")
}

fn tolerate_no_execute() -> DeviceToleration {
    toleration("taint-key", "Equal", "taint-value-2", "NoExecute")
}

fn tolerating_request(tolerations: Vec<DeviceToleration>) -> DeviceRequest {
    request_with(REQ0, CLASS_A, 1, |r| r.tolerations = Some(tolerations))
}

fn cap_request(name: &str, value: &str) -> DeviceRequest {
    request_with(name, CLASS_A, 1, |r| {
        r.capacity = Some(capacity_request(value))
    })
}

fn consumed(device: &str, amount: &str) -> AllocatedState {
    let mut state = AllocatedState::new();
    state.insert_shared(
        DeviceId::new(DRIVER_A, POOL1, device),
        "previous",
        [(CAPACITY0.to_owned(), Amount::parse(amount).unwrap())],
    );
    state
}

/// Node 1's slice of two devices, tainted `NoSchedule` and `NoExecute`.
fn tainted_pair() -> Vec<ResourceSlice> {
    vec![node_slice(
        SLICE1,
        NODE1,
        POOL1,
        DRIVER_A,
        vec![
            tainted(device(DEVICE1), &[no_schedule()]),
            tainted(device(DEVICE2), &[no_execute()]),
        ],
    )]
}

/// Class A, allowing multiple allocations of a device.
fn multi_class() -> Vec<DeviceClass> {
    vec![class_multi(CLASS_A, DRIVER_A, true)]
}

/// Node 1's slice of the one device `d`.
fn one_multi(d: Device) -> Vec<ResourceSlice> {
    vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, vec![d])]
}

pub fn cases() -> Vec<Case> {
    [
        taint_cases(),
        taint_effect_cases(),
        tainted_request_kind_cases(),
        capacity_without_request_cases(),
        capacity_default_policy_cases(),
        capacity_zero_and_range_policy_cases(),
        capacity_value_policy_cases(),
        capacity_already_allocated_cases(),
        capacity_backtracking_cases(),
        capacity_mode_all_and_dedicated_cases(),
        multi_allocatable_selection_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Tainted devices, tolerated or not.
fn taint_cases() -> Vec<Case> {
    vec![
        Case {
            name: "tainted-two-devices",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: tainted_pair(),
            expect: Expect::UnsatisfiableBecause(
                "taint taint-key=taint-value:NoSchedule not tolerated: driver-a/pool-1/device-1",
            ),
            ..Default::default()
        },
        Case {
            name: "tainted-one-device-two-taints",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(device(DEVICE1), &[no_schedule(), no_execute()])],
            )],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "tainted-two-devices-tolerated",
            claims: vec![claim(
                CLAIM0,
                vec![tolerating_request(vec![tolerate_no_execute()])],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: tainted_pair(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![tolerating(
                    result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    &[tolerate_no_execute()],
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "tainted-two-devices-prioritized-list-tolerated",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![
                        sub(SUB0, CLASS_A, 1),
                        sub_with(SUB1, CLASS_A, 1, |s| {
                            s.tolerations = Some(vec![tolerate_no_execute()])
                        }),
                    ],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: tainted_pair(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![tolerating(
                    result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE2),
                    &[tolerate_no_execute()],
                )],
            )]),
            ..Default::default()
        },
    ]
}

/// Taints without an effect, and two taints both tolerated.
fn taint_effect_cases() -> Vec<Case> {
    vec![
        Case {
            name: "tainted-no-effect",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(
                    device(DEVICE1),
                    &[taint("taint-key", "taint-value", "None")],
                )],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "tainted-one-device-two-taints-both-tolerated",
            claims: vec![claim(
                CLAIM0,
                vec![tolerating_request(vec![
                    tolerate_no_schedule(),
                    tolerate_no_execute(),
                ])],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(device(DEVICE1), &[no_schedule(), no_execute()])],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![tolerating(
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    &[tolerate_no_schedule(), tolerate_no_execute()],
                )],
            )]),
            ..Default::default()
        },
    ]
}

/// Taints under a prioritized list, admin access and `allocationMode: All`.
fn tainted_request_kind_cases() -> Vec<Case> {
    vec![
        Case {
            name: "tainted-prioritized-list",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_B, 1), sub(SUB1, CLASS_A, 1)],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(device(DEVICE1), &[no_schedule()])],
            )],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "tainted-admin-access",
            claims: vec![claim(
                CLAIM0,
                vec![request_with(REQ0, CLASS_A, 1, |r| {
                    r.admin_access = Some(true)
                })],
            )],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1), (DRIVER_A, POOL1, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(device(DEVICE1), &[no_schedule()])],
            )],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "tainted-all-devices-single",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![tainted(device(DEVICE1), &[no_schedule()])],
            )],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
    ]
}

/// A multi-allocatable device and claims that request no capacity.
fn capacity_without_request_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-missing-capacity-request",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "1")])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: one_multi(multi(capacity(device(DEVICE1), &[(CAPACITY1, "1")]))),
            expect: Expect::UnsatisfiableBecause(
                "asks for capacity capacity-0, which the device does not publish",
            ),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-without-capacity-without-capacity-request",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM1, REQ0, CLASS_A),
            ],
            classes: multi_class(),
            slices: one_multi(multi(device(DEVICE1))),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(result(REQ0, DRIVER_A, POOL1, DEVICE1), &[])],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(result(REQ0, DRIVER_A, POOL1, DEVICE1), &[])],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM1, REQ0, CLASS_A),
            ],
            classes: multi_class(),
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    multi(capacity(device(DEVICE1), &[(CAPACITY0, "1")])),
                    multi(capacity(device(DEVICE2), &[(CAPACITY0, "1")])),
                ],
            )],
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "1")],
                    )],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE2),
                        &[(CAPACITY0, "1")],
                    )],
                ),
            ]),
            ..Default::default()
        },
    ]
}

/// A device without a request policy: blocked, or given what is requested; a policy's default.
fn capacity_default_policy_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-without-policy-without-capacity-request-block",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM1, REQ0, CLASS_A),
            ],
            classes: multi_class(),
            slices: one_multi(multi(capacity(device(DEVICE1), &[(CAPACITY0, "2")]))),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-without-policy-with-capacity-request",
            claims: vec![
                claim(CLAIM0, vec![cap_request(REQ0, "1")]),
                claim(CLAIM1, vec![cap_request(REQ0, "1")]),
            ],
            classes: multi_class(),
            slices: one_multi(multi(capacity(device(DEVICE1), &[(CAPACITY0, "2")]))),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "1")],
                    )],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "1")],
                    )],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-policy-without-capacity-request",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM1, REQ0, CLASS_A),
            ],
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "4")),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "2")],
                    )],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "2")],
                    )],
                ),
            ]),
            ..Default::default()
        },
    ]
}

/// Request policies: zero requests, and ranges with a step.
fn capacity_zero_and_range_policy_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-zero-request-policy",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                simple_claim(CLAIM1, REQ0, CLASS_A),
            ],
            classes: multi_class(),
            slices: one_multi(policy_values(multi(device(DEVICE1)), "0", "1", &[])),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "0")],
                    )],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "0")],
                    )],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-violates-zero-request-policy",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "1")])],
            classes: multi_class(),
            slices: one_multi(policy_values(multi(device(DEVICE1)), "0", "1", &[])),
            expect: Expect::UnsatisfiableBecause("is not allowed by the device's request policy"),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-range-policy-with-capacity-request",
            claims: vec![
                claim(CLAIM0, vec![cap_request(REQ0, "1")]),
                claim(CLAIM1, vec![cap_request(REQ0, "1")]),
            ],
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "4")),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "2")],
                    )],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![shared(
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        &[(CAPACITY0, "2")],
                    )],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-range-policy-step",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "3")])],
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "4")),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    &[(CAPACITY0, "4")],
                )],
            )]),
            ..Default::default()
        },
    ]
}

/// Valid-values policies, and requests over the capacity or the sharing policy.
fn capacity_value_policy_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-valid-values-policy",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "2")])],
            classes: multi_class(),
            slices: one_multi(policy_values(multi(device(DEVICE1)), "1", "4", &["2"])),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    &[(CAPACITY0, "2")],
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-valid-values-policy-round-up",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "2")])],
            classes: multi_class(),
            slices: one_multi(policy_values(multi(device(DEVICE1)), "1", "3", &["3"])),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    &[(CAPACITY0, "3")],
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-exceeded-consumable-capacity-request",
            claims: vec![
                claim(CLAIM0, vec![cap_request(REQ0, "1")]),
                claim(CLAIM1, vec![cap_request(REQ0, "2")]),
            ],
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "2")),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-request-over-max-sharing-policy",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "6")])],
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "10")),
            expect: Expect::UnsatisfiableBecause("capacity capacity-0: 6 is not allowed"),
            ..Default::default()
        },
    ]
}

/// Capacity already allocated: the rest used, the next device taken, none left.
fn capacity_already_allocated_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-allocated-capacity-use-remaining",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "2")])],
            allocated: consumed(DEVICE1, "2"),
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "4")),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    &[(CAPACITY0, "2")],
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-allocated-capacity-next-device",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "2")])],
            allocated: consumed(DEVICE1, "2"),
            classes: multi_class(),
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    policy_range(multi(device(DEVICE1)), "2"),
                    policy_range(multi(device(DEVICE2)), "2"),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    &[(CAPACITY0, "2")],
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-multi-allocatable-device-with-no-available-consumable-capacity",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "2")])],
            allocated: consumed(DEVICE1, "2"),
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "2")),
            expect: Expect::UnsatisfiableBecause("capacity capacity-0: 2 wanted, 0 left"),
            ..Default::default()
        },
    ]
}

/// Going back on a multi-allocatable device choice.
fn capacity_backtracking_cases() -> Vec<Case> {
    vec![Case {
        name: "consumable-capacity-with-multi-allocatable-device-backtrack",
        claims: vec![
            claim_with(
                CLAIM0,
                vec![cap_request(REQ0, "2"), cap_request(REQ1, "2")],
                vec![match_attribute(STRING_ATTRIBUTE, &[])],
                vec![],
            ),
            claim(CLAIM1, vec![cap_request(REQ0, "2")]),
        ],
        classes: vec![class(CLASS_A, DRIVER_A)],
        slices: vec![node_slice(
            SLICE1,
            NODE1,
            POOL1,
            DRIVER_A,
            vec![
                policy_range(
                    multi(attrs(
                        device(DEVICE2),
                        &[("stringAttribute", string_attr("stringAttributeValue1"))],
                    )),
                    "2",
                ),
                policy_range(
                    multi(attrs(
                        device(DEVICE1),
                        &[("stringAttribute", string_attr("stringAttributeValue2"))],
                    )),
                    "4",
                ),
            ],
        )],
        expect: Expect::Results(vec![
            allocation(
                Some(local(NODE1)),
                vec![
                    shared(result(REQ0, DRIVER_A, POOL1, DEVICE1), &[(CAPACITY0, "2")]),
                    shared(result(REQ1, DRIVER_A, POOL1, DEVICE1), &[(CAPACITY0, "2")]),
                ],
            ),
            allocation(
                Some(local(NODE1)),
                vec![shared(
                    result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    &[(CAPACITY0, "2")],
                )],
            ),
        ]),
        ..Default::default()
    }]
}

/// `allocationMode: All` over multi-allocatable devices, and dedicated devices asked for capacity.
fn capacity_mode_all_and_dedicated_cases() -> Vec<Case> {
    vec![
        Case {
            name: "consumable-capacity-multi-allocatable-device-allocation-mode-all-allocating-sufficient",
            claims: vec![claim(
                CLAIM0,
                vec![
                    cap_request(REQ0, "1"),
                    with(all_request(REQ1, CLASS_A), |r| {
                        r.exactly.as_mut().unwrap().capacity = Some(capacity_request("1"))
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
                    multi(capacity(device(DEVICE1), &[(CAPACITY0, "2")])),
                    multi(capacity(device(DEVICE2), &[(CAPACITY0, "1")])),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    shared(result(REQ0, DRIVER_A, POOL1, DEVICE1), &[(CAPACITY0, "1")]),
                    shared(result(REQ1, DRIVER_A, POOL1, DEVICE1), &[(CAPACITY0, "1")]),
                    shared(result(REQ1, DRIVER_A, POOL1, DEVICE2), &[(CAPACITY0, "1")]),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-dedicated-device-with-consumable-capacity-request",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "1")])],
            classes: vec![class_multi(CLASS_A, DRIVER_A, false)],
            slices: one_multi(capacity(device(DEVICE1), &[(CAPACITY0, "1")])),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "consumable-capacity-dedicated-device-with-multiple-consumable-capacity-request",
            claims: vec![
                claim(CLAIM0, vec![cap_request(REQ0, "1")]),
                claim(CLAIM1, vec![cap_request(REQ0, "1")]),
            ],
            classes: vec![class_multi(CLASS_A, DRIVER_A, false)],
            slices: one_multi(policy_range(device(DEVICE1), "2")),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
    ]
}

/// When a multi-allocatable device is left out: by a class selector, once dedicated, by a distinct constraint.
fn multi_allocatable_selection_cases() -> Vec<Case> {
    vec![
        Case {
            name: "allow-multiple-allocations-exclude-multi-allocatable-device-by-class-selector",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "1")])],
            classes: vec![class_multi(CLASS_A, DRIVER_A, false)],
            slices: one_multi(multi(capacity(device(DEVICE1), &[(CAPACITY0, "1")]))),
            expect: Expect::UnsatisfiableBecause("0 match the class selectors"),
            ..Default::default()
        },
        Case {
            name: "allow-multiple-allocations-not-allocate-multi-allocatable-device-which-already-dedicated",
            claims: vec![claim(CLAIM0, vec![cap_request(REQ0, "1")])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: multi_class(),
            slices: one_multi(policy_range(multi(device(DEVICE1)), "2")),
            expect: Expect::UnsatisfiableBecause("in use by another claim"),
            ..Default::default()
        },
        Case {
            name: "distinct-constraint-one-multi-allocatable-device-with-distinct-constraint",
            claims: vec![claim_with(
                CLAIM0,
                vec![cap_request(REQ0, "1"), cap_request(REQ1, "1")],
                vec![distinct_attribute(STRING_ATTRIBUTE, &[])],
                vec![],
            )],
            classes: multi_class(),
            slices: one_multi(policy_range(
                multi(attrs(
                    device(DEVICE1),
                    &[("stringAttribute", string_attr("stringAttributeValue"))],
                )),
                "2",
            )),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
    ]
}
