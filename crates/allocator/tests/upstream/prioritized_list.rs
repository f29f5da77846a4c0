//! Upstream cases: `firstAvailable` (prioritized list) requests.

use crate::support::*;

const REQ0_SUB0: &str = "req-0/subReq-0";
const REQ0_SUB1: &str = "req-0/subReq-1";
const REQ1_SUB1: &str = "req-1/subReq-1";
const REQ2_SUB1: &str = "req-2/subReq-1";

fn mem(name: &str, memory: &str) -> k8s_openapi::api::resource::v1::Device {
    capacity(device(name), &[("memory", memory)])
}

fn sub_mem(
    name: &str,
    count: i64,
    at_least: &str,
) -> k8s_openapi::api::resource::v1::DeviceSubRequest {
    sub_with(name, CLASS_A, count, |s| {
        s.selectors = Some(vec![memory_at_least(at_least)])
    })
}

fn all_sub(name: &str, class: &str) -> k8s_openapi::api::resource::v1::DeviceSubRequest {
    sub_with(name, class, 0, |s| {
        s.allocation_mode = Some("All".into());
        s.count = None;
    })
}

pub fn cases() -> Vec<Case> {
    [
        first_available_cases(),
        subrequest_config_cases(),
        claim_config_scope_cases(),
        subrequest_expression_cases(),
        subrequest_constraint_cases(),
        allocation_mode_all_cases(),
        backtracking_cases(),
        device_limit_cases(),
        combination_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `firstAvailable`: the first subrequest unavailable, or none available.
fn first_available_cases() -> Vec<Case> {
    vec![
        Case {
            name: "prioritized-list-first-unavailable",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_B, 1), sub(SUB1, CLASS_A, 1)],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "prioritized-list-non-available",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_B, 2), sub(SUB1, CLASS_A, 2)],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![
                one_device_slice(SLICE1, POOL1, DRIVER_A),
                one_device_slice(SLICE2, POOL2, DRIVER_B),
            ],
            expect: Expect::UnsatisfiableBecause(
                "request req-0/subReq-1 (class class-a) wants 2 devices",
            ),
            ..Default::default()
        },
    ]
}

/// Device and class configuration for the subrequest chosen.
fn subrequest_config_cases() -> Vec<Case> {
    vec![
        Case {
            name: "prioritized-list-device-config",
            claims: vec![claim_with(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_A, 1), sub(SUB1, CLASS_B, 2)],
                )],
                vec![],
                vec![
                    claim_config(&[REQ0_SUB0], DRIVER_A, "foo"),
                    claim_config(&[REQ0_SUB1], DRIVER_B, "bar"),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_B,
                vec![device(DEVICE1), device(DEVICE2)],
            )],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0_SUB1, DRIVER_B, POOL1, DEVICE1),
                    result(REQ0_SUB1, DRIVER_B, POOL1, DEVICE2),
                ],
                vec![config("FromClaim", &[], DRIVER_B, "bar")],
            )]),
            ..Default::default()
        },
        Case {
            name: "prioritized-list-class-config",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_A, 2), sub(SUB1, CLASS_B, 2)],
                )],
            )],
            classes: vec![
                class_with_config(CLASS_A, DRIVER_A, "foo"),
                class_with_config(CLASS_B, DRIVER_B, "bar"),
            ],
            slices: vec![
                node_slice(
                    SLICE1,
                    NODE1,
                    POOL1,
                    DRIVER_B,
                    vec![device(DEVICE1), device(DEVICE2)],
                ),
                node_slice(SLICE2, NODE1, POOL2, DRIVER_A, vec![device(DEVICE3)]),
            ],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0_SUB1, DRIVER_B, POOL1, DEVICE1),
                    result(REQ0_SUB1, DRIVER_B, POOL1, DEVICE2),
                ],
                vec![config("FromClass", &[], DRIVER_B, "bar")],
            )]),
            ..Default::default()
        },
    ]
}

/// Claim configuration scoped to subrequests, or covering all requests.
fn claim_config_scope_cases() -> Vec<Case> {
    vec![
        Case {
            name: "claim-config-scoped-to-subrequests-of-one-request",
            claims: vec![claim_with(
                CLAIM0,
                vec![
                    first_available(REQ0, vec![sub(SUB0, CLASS_A, 1), sub(SUB1, CLASS_B, 1)]),
                    request(REQ1, CLASS_A, 1),
                ],
                vec![],
                vec![claim_config(&[REQ0_SUB0, REQ0_SUB1], DRIVER_A, "scoped")],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(2))],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0_SUB0, DRIVER_A, POOL1, DEVICE0),
                    result(REQ1, DRIVER_A, POOL1, DEVICE1),
                ],
                vec![config(
                    "FromClaim",
                    &[REQ0_SUB0, REQ0_SUB1],
                    DRIVER_A,
                    "scoped",
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "claim-config-covering-all-requests-is-cleared",
            claims: vec![claim_with(
                CLAIM0,
                vec![
                    first_available(REQ0, vec![sub(SUB0, CLASS_A, 1), sub(SUB1, CLASS_B, 1)]),
                    request(REQ1, CLASS_A, 1),
                ],
                vec![],
                vec![claim_config(&[REQ0_SUB0, REQ1], DRIVER_A, "all")],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(2))],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0_SUB0, DRIVER_A, POOL1, DEVICE0),
                    result(REQ1, DRIVER_A, POOL1, DEVICE1),
                ],
                vec![config("FromClaim", &[], DRIVER_A, "all")],
            )]),
            ..Default::default()
        },
    ]
}

/// Subrequests with CEL selectors.
fn subrequest_expression_cases() -> Vec<Case> {
    vec![Case {
        name: "prioritized-list-subrequests-with-expressions",
        claims: vec![claim(
            CLAIM0,
            vec![
                request_with(REQ0, CLASS_A, 1, |r| {
                    r.selectors = Some(vec![memory_at_least("1Gi")])
                }),
                first_available(REQ1, vec![sub_mem(SUB0, 1, "4Gi"), sub_mem(SUB1, 2, "2Gi")]),
            ],
        )],
        classes: vec![class(CLASS_A, DRIVER_A)],
        slices: vec![node_slice(
            SLICE1,
            NODE1,
            POOL1,
            DRIVER_A,
            vec![
                mem(DEVICE1, "2Gi"),
                mem(DEVICE2, "2Gi"),
                mem(DEVICE3, "1Gi"),
            ],
        )],
        expect: Expect::Results(vec![allocation(
            Some(local(NODE1)),
            vec![
                result(REQ0, DRIVER_A, POOL1, DEVICE3),
                result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE1),
                result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE2),
            ],
        )]),
        ..Default::default()
    }]
}

/// Constraints naming the parent request of subrequests.
fn subrequest_constraint_cases() -> Vec<Case> {
    vec![Case {
        name: "prioritized-list-subrequests-with-constraints-ref-parent-request",
        claims: vec![claim_with(
            CLAIM0,
            vec![
                request_with(REQ0, CLASS_A, 1, |r| {
                    r.selectors = Some(vec![memory_at_least("8Gi")])
                }),
                first_available(REQ1, vec![sub_mem(SUB0, 1, "2Gi"), sub_mem(SUB1, 1, "1Gi")]),
            ],
            vec![match_attribute(VERSION_ATTRIBUTE, &[REQ0, REQ1])],
            vec![],
        )],
        classes: vec![class(CLASS_A, DRIVER_A)],
        slices: vec![
            node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![attrs(
                    mem(DEVICE1, "8Gi"),
                    &[("driverVersion", version_attr("1.0.0"))],
                )],
            ),
            node_slice(
                SLICE2,
                NODE1,
                POOL2,
                DRIVER_A,
                vec![
                    attrs(
                        mem(DEVICE2, "2Gi"),
                        &[("driverVersion", version_attr("2.0.0"))],
                    ),
                    attrs(
                        mem(DEVICE3, "1Gi"),
                        &[("driverVersion", version_attr("1.0.0"))],
                    ),
                ],
            ),
        ],
        expect: Expect::Results(vec![allocation(
            Some(local(NODE1)),
            vec![
                result(REQ0, DRIVER_A, POOL1, DEVICE1),
                result(REQ1_SUB1, DRIVER_A, POOL2, DEVICE3),
            ],
        )]),
        ..Default::default()
    }]
}

/// Subrequests with `allocationMode: All`.
fn allocation_mode_all_cases() -> Vec<Case> {
    vec![
        Case {
            name: "prioritized-list-subrequests-with-allocation-mode-all",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![all_sub(SUB0, CLASS_A), sub(SUB1, CLASS_A, 1)],
                )],
            )],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![device(DEVICE1), device(DEVICE2)],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE2)],
            )]),
            ..Default::default()
        },
        Case {
            name: "all-devices-slice-without-devices-prioritized-list",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![all_sub(SUB0, CLASS_A), sub(SUB1, CLASS_B, 1)],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![
                node_slice(SLICE1, NODE1, POOL1, DRIVER_A, vec![]),
                one_device_slice(SLICE2, POOL2, DRIVER_B),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_B, POOL2, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "prioritized-list-allocation-mode-all-multiple-requests",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request(REQ0, CLASS_A, 1),
                    first_available(REQ1, vec![all_sub(SUB0, CLASS_A), sub(SUB1, CLASS_A, 1)]),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![device(DEVICE1), device(DEVICE2)],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE2),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Going back on an earlier subrequest choice.
fn backtracking_cases() -> Vec<Case> {
    vec![Case {
        name: "prioritized-list-with-backtracking",
        claims: vec![claim(
            CLAIM0,
            vec![
                first_available(REQ0, vec![sub_mem(SUB0, 1, "8Gi"), sub_mem(SUB1, 1, "4Gi")]),
                request_with(REQ1, CLASS_A, 1, |r| {
                    r.selectors = Some(vec![memory_at_least("8Gi")])
                }),
            ],
        )],
        classes: vec![class(CLASS_A, DRIVER_A)],
        slices: vec![
            node_slice(SLICE1, NODE1, POOL1, DRIVER_A, vec![mem(DEVICE1, "8Gi")]),
            node_slice(SLICE2, NODE1, POOL2, DRIVER_A, vec![mem(DEVICE2, "4Gi")]),
        ],
        expect: Expect::Results(vec![allocation(
            Some(local(NODE1)),
            vec![
                result(REQ0_SUB1, DRIVER_A, POOL2, DEVICE2),
                result(REQ1, DRIVER_A, POOL1, DEVICE1),
            ],
        )]),
        ..Default::default()
    }]
}

/// The limit on devices per request, met in the first subrequest or with `allocationMode: All`.
fn device_limit_cases() -> Vec<Case> {
    vec![
        Case {
            name: "prioritized-list-too-many-in-first-subrequest",
            claims: vec![claim(
                CLAIM0,
                vec![first_available(
                    REQ0,
                    vec![sub(SUB0, CLASS_B, 500), sub(SUB1, CLASS_A, 1)],
                )],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "prioritized-list-max-allocation-limit-request",
            claims: vec![claim(
                CLAIM0,
                vec![
                    first_available(REQ0, vec![sub(SUB0, CLASS_A, 32), sub(SUB1, CLASS_A, 16)]),
                    first_available(REQ1, vec![sub(SUB0, CLASS_A, 32), sub(SUB1, CLASS_A, 16)]),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(64))],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                (0..16)
                    .map(|i| result(REQ0_SUB1, DRIVER_A, POOL1, &format!("device-{i}")))
                    .chain(
                        (16..32)
                            .map(|i| result(REQ1_SUB1, DRIVER_A, POOL1, &format!("device-{i}"))),
                    )
                    .collect(),
            )]),
            ..Default::default()
        },
        Case {
            name: "prioritized-list-max-allocation-allocation-mode-all",
            claims: vec![claim(
                CLAIM0,
                vec![
                    first_available(REQ0, vec![all_sub(SUB0, CLASS_A), sub(SUB1, CLASS_A, 2)]),
                    request(REQ1, CLASS_B, 2),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![
                node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(31)),
                node_slice(SLICE2, NODE1, POOL2, DRIVER_B, devices(2)),
            ],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE0),
                    result(REQ0_SUB1, DRIVER_A, POOL1, DEVICE1),
                    result(REQ1, DRIVER_B, POOL2, DEVICE0),
                    result(REQ1, DRIVER_B, POOL2, DEVICE1),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Combinations searched across subrequests.
fn combination_cases() -> Vec<Case> {
    vec![Case {
        name: "check-combinations-with-prioritized-list",
        claims: vec![claim(
            CLAIM0,
            vec![
                first_available(
                    REQ1,
                    vec![
                        sub_with(SUB0, CLASS_A, 3, |s| {
                            s.selectors = Some(vec![selector(
                                "device.attributes[\"driver-a\"].type == \"Y\"",
                            )])
                        }),
                        sub(SUB1, CLASS_A, 2),
                    ],
                ),
                first_available(
                    REQ2,
                    vec![
                        sub(SUB0, CLASS_A, 2),
                        sub_with(SUB1, CLASS_A, 1, |s| {
                            s.selectors = Some(vec![selector(
                                "device.attributes[\"driver-a\"].type == \"X\"",
                            )])
                        }),
                    ],
                ),
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
                result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE2),
                result(REQ1_SUB1, DRIVER_A, POOL1, DEVICE3),
                result(REQ2_SUB1, DRIVER_A, POOL1, DEVICE1),
            ],
        )]),
        ..Default::default()
    }]
}
