//! Upstream cases: `allocationMode: All` and admin access.

use crate::support::*;

fn admin_request(
    name: &str,
    class: &str,
    count: i64,
) -> k8s_openapi::api::resource::v1::DeviceRequest {
    request_with(name, class, count, |r| r.admin_access = Some(true))
}

fn two_devices() -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    vec![node_slice(
        SLICE1,
        NODE1,
        POOL1,
        DRIVER_A,
        vec![device(DEVICE1), device(DEVICE2)],
    )]
}

pub fn cases() -> Vec<Case> {
    [
        all_devices_cases(),
        all_devices_edge_cases(),
        allocated_and_admin_access_cases(),
        admin_access_sharing_cases(),
        multi_host_all_devices_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `allocationMode: All`: one device, many, an incomplete pool, plus another request.
fn all_devices_cases() -> Vec<Case> {
    vec![
        Case {
            name: "all-devices-single",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
            )]),
            ..Default::default()
        },
        Case {
            name: "all-devices-many",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![
                one_device_slice(SLICE1, POOL1, DRIVER_A),
                one_device_slice(SLICE1, POOL2, DRIVER_A),
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
            name: "all-devices-of-the-incomplete-pool",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![with(one_device_slice(SLICE1, POOL1, DRIVER_A), |s| {
                s.spec.pool.resource_slice_count += 1
            })],
            expect: Expect::Error(
                "claim claim-0, request req-0: asks for all devices, but resource pool driver-a/pool-1 is currently being updated",
            ),
            ..Default::default()
        },
        Case {
            name: "all-devices-plus-another",
            claims: vec![
                claim(CLAIM0, vec![all_request(REQ0, CLASS_A)]),
                claim(CLAIM1, vec![request(REQ0, CLASS_B, 1)]),
            ],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: vec![
                one_device_slice(SLICE1, POOL1, DRIVER_A),
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
    ]
}

/// `allocationMode: All` in the other order, with no solution, and over a slice without devices.
fn all_devices_edge_cases() -> Vec<Case> {
    vec![
        Case {
            name: "all-devices-many-plus-another-reversed",
            claims: vec![
                claim(CLAIM1, vec![request(REQ0, CLASS_B, 1)]),
                claim(CLAIM0, vec![all_request(REQ0, CLASS_A)]),
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
                    vec![result(REQ0, DRIVER_B, POOL1, DEVICE1)],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![
                        result(REQ0, DRIVER_A, POOL1, DEVICE1),
                        result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    ],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "all-devices-no-solution",
            claims: vec![
                claim(CLAIM1, vec![request(REQ0, CLASS_A, 1)]),
                claim(CLAIM0, vec![all_request(REQ0, CLASS_A)]),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "all-devices-no-solution-reversed",
            claims: vec![
                claim(CLAIM0, vec![all_request(REQ0, CLASS_A)]),
                claim(CLAIM1, vec![request(REQ0, CLASS_A, 1)]),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "all-devices-slice-without-devices",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, vec![])],
            expect: Expect::UnsatisfiableBecause("wants all matching devices (0)"),
            ..Default::default()
        },
    ]
}

/// Devices already allocated or being allocated, with and without admin access.
fn allocated_and_admin_access_cases() -> Vec<Case> {
    vec![
        Case {
            name: "all-devices-some-allocated",
            claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::UnsatisfiableBecause(
                "in use by another claim: driver-a/pool-1/device-1",
            ),
            ..Default::default()
        },
        Case {
            name: "all-devices-some-allocated-admin-access",
            claims: vec![claim(
                CLAIM0,
                vec![with(all_request(REQ0, CLASS_A), |r| {
                    r.exactly.as_mut().unwrap().admin_access = Some(true)
                })],
            )],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    admin(result(REQ0, DRIVER_A, POOL1, DEVICE1)),
                    admin(result(REQ0, DRIVER_A, POOL1, DEVICE2)),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "all-devices-some-allocating-admin-access",
            claims: vec![claim(
                CLAIM0,
                vec![
                    admin_request(REQ0, CLASS_A, 1),
                    with(all_request(REQ1, CLASS_A), |r| {
                        r.exactly.as_mut().unwrap().admin_access = Some(true)
                    }),
                ],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "count-devices-some-allocated-admin-access",
            claims: vec![claim(CLAIM0, vec![admin_request(REQ0, CLASS_A, 2)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    admin(result(REQ0, DRIVER_A, POOL1, DEVICE1)),
                    admin(result(REQ0, DRIVER_A, POOL1, DEVICE2)),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Admin access shares a device with other claims, and is allowed when the feature is on.
fn admin_access_sharing_cases() -> Vec<Case> {
    vec![
        Case {
            name: "separate-claims-share-device-admin-access",
            claims: vec![
                claim(CLAIM0, vec![admin_request(REQ0, CLASS_A, 1)]),
                claim(CLAIM1, vec![admin_request(REQ0, CLASS_A, 1)]),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![admin(result(REQ0, DRIVER_A, POOL1, DEVICE1))],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![admin(result(REQ0, DRIVER_A, POOL1, DEVICE1))],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "admin-access-claims-device-allocating-for-non-admin-access",
            claims: vec![
                simple_claim(CLAIM0, REQ0, CLASS_A),
                claim(CLAIM1, vec![admin_request(REQ0, CLASS_A, 1)]),
            ],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: two_devices(),
            expect: Expect::Results(vec![
                allocation(
                    Some(local(NODE1)),
                    vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
                ),
                allocation(
                    Some(local(NODE1)),
                    vec![admin(result(REQ0, DRIVER_A, POOL1, DEVICE1))],
                ),
            ]),
            ..Default::default()
        },
        Case {
            name: "admin-access-enabled",
            claims: vec![claim(CLAIM0, vec![admin_request(REQ0, CLASS_A, 1)])],
            allocated: allocated(&[(DRIVER_A, POOL1, DEVICE1), (DRIVER_A, POOL1, DEVICE2)]),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![admin(result(REQ0, DRIVER_A, POOL1, DEVICE1))],
            )]),
            ..Default::default()
        },
    ]
}

/// `allocationMode: All` over a pool whose slices target different nodes.
fn multi_host_all_devices_cases() -> Vec<Case> {
    vec![Case {
        name: "allocation-mode-all-with-multi-host-resource-pool",
        claims: vec![claim(CLAIM0, vec![all_request(REQ0, CLASS_A)])],
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
                On::Node(NODE2),
                pool(POOL1, 2),
                DRIVER_A,
                vec![device(DEVICE2)],
            ),
        ],
        expect: Expect::Results(vec![allocation(
            Some(local(NODE1)),
            vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
        )]),
        ..Default::default()
    }]
}
