//! Upstream cases: matchAttribute / distinctAttribute constraints (scalar and list attributes) and
//! configuration in results.

use crate::support::*;

fn full_attrs(
    name: &str,
    version: &str,
    numa: i64,
    string: &str,
    boolean: bool,
) -> k8s_openapi::api::resource::v1::Device {
    attrs(
        device(name),
        &[
            ("driverVersion", version_attr(version)),
            ("numa", int_attr(numa)),
            ("stringAttribute", string_attr(string)),
            ("boolAttribute", bool_attr(boolean)),
        ],
    )
}

fn pair(
    a: k8s_openapi::api::resource::v1::Device,
    b: k8s_openapi::api::resource::v1::Device,
) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, vec![a, b])]
}

fn two_of_req0(
    constraint: k8s_openapi::api::resource::v1::DeviceConstraint,
) -> Vec<k8s_openapi::api::resource::v1::ResourceClaim> {
    vec![claim_with(
        CLAIM0,
        vec![request(REQ0, CLASS_A, 2)],
        vec![constraint],
        vec![],
    )]
}

/// Two devices of pool 1 on node 1, both allocated for the first request.
fn both(a: &str, b: &str) -> Expect {
    Expect::Results(vec![allocation(
        Some(local(NODE1)),
        vec![
            result(REQ0, DRIVER_A, POOL1, a),
            result(REQ0, DRIVER_A, POOL1, b),
        ],
    )])
}

pub fn cases() -> Vec<Case> {
    [
        match_attribute_cases(),
        match_attribute_kind_cases(),
        constraint_for_request_cases(),
        distinct_attribute_cases(),
        list_attribute_match_cases(),
        list_attribute_distinct_cases(),
        class_config_cases(),
        claim_config_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `matchAttribute`: a match, a missing attribute, an int that differs (one device and all).
fn match_attribute_cases() -> Vec<Case> {
    vec![
        Case {
            name: "with-constraint",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1), request(REQ1, CLASS_A, 1)],
                vec![
                    match_attribute(INT_ATTRIBUTE, &[]),
                    match_attribute(VERSION_ATTRIBUTE, &[]),
                    match_attribute(STRING_ATTRIBUTE, &[]),
                    match_attribute(BOOL_ATTRIBUTE, &[]),
                ],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                full_attrs(DEVICE1, "1.0.0", 1, "stringAttributeValue", true),
                full_attrs(DEVICE2, "1.0.0", 1, "stringAttributeValue", true),
            ),
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
            name: "with-constraint-non-existent-attribute",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1)],
                vec![match_attribute(NON_EXISTENT_ATTRIBUTE, &[])],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::UnsatisfiableBecause("1 available devices lack the attribute"),
            ..Default::default()
        },
        Case {
            name: "with-constraint-not-matching-int-attribute",
            claims: two_of_req0(match_attribute(INT_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: pair(
                attrs(device(DEVICE1), &[("numa", int_attr(1))]),
                attrs(device(DEVICE2), &[("numa", int_attr(2))]),
            ),
            expect: Expect::UnsatisfiableBecause("matchAttribute driver-a/numa: 2 needed"),
            ..Default::default()
        },
        Case {
            name: "with-constraint-not-matching-int-attribute-all-devices",
            claims: vec![claim_with(
                CLAIM0,
                vec![all_request(REQ0, CLASS_A)],
                vec![match_attribute(INT_ATTRIBUTE, &[])],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A), class(CLASS_B, DRIVER_B)],
            slices: pair(
                attrs(device(DEVICE1), &[("numa", int_attr(1))]),
                attrs(device(DEVICE2), &[("numa", int_attr(2))]),
            ),
            expect: Expect::Error(
                "claim claim-0, request req-0: cannot add device driver-a/pool-1/device-2 because a claim constraint would not be satisfied",
            ),
            ..Default::default()
        },
    ]
}

/// `matchAttribute` on a string, bool or version that differs.
fn match_attribute_kind_cases() -> Vec<Case> {
    vec![
        Case {
            name: "with-constraint-not-matching-string-attribute",
            claims: two_of_req0(match_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[("stringAttribute", string_attr("stringAttributeValue"))],
                ),
                attrs(
                    device(DEVICE2),
                    &[("stringAttribute", string_attr("stringAttributeValue2"))],
                ),
            ),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "with-constraint-not-matching-bool-attribute",
            claims: two_of_req0(match_attribute(BOOL_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(device(DEVICE1), &[("boolAttribute", bool_attr(true))]),
                attrs(device(DEVICE2), &[("boolAttribute", bool_attr(false))]),
            ),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "with-constraint-not-matching-version-attribute",
            claims: two_of_req0(match_attribute(VERSION_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(device(DEVICE1), &[("driverVersion", version_attr("1.0.0"))]),
                attrs(device(DEVICE2), &[("driverVersion", version_attr("2.0.0"))]),
            ),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
    ]
}

/// A constraint limited to some requests, and the retry it forces.
fn constraint_for_request_cases() -> Vec<Case> {
    vec![
        Case {
            name: "with-constraint-for-request",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1), request(REQ1, CLASS_A, 1)],
                vec![match_attribute(VERSION_ATTRIBUTE, &[REQ0])],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(device(DEVICE1), &[("driverVersion", version_attr("1.0.0"))]),
                attrs(device(DEVICE2), &[("driverVersion", version_attr("2.0.0"))]),
            ),
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
            name: "with-constraint-for-request-retry",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1), request(REQ1, CLASS_A, 1)],
                vec![
                    match_attribute(VERSION_ATTRIBUTE, &[REQ0]),
                    match_attribute(STRING_ATTRIBUTE, &[]),
                ],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    attrs(
                        device(DEVICE1),
                        &[
                            ("driverVersion", version_attr("1.0.0")),
                            ("stringAttribute", string_attr("a")),
                        ],
                    ),
                    attrs(
                        device(DEVICE2),
                        &[
                            ("driverVersion", version_attr("2.0.0")),
                            ("stringAttribute", string_attr("b")),
                        ],
                    ),
                    attrs(
                        device(DEVICE3),
                        &[
                            ("driverVersion", version_attr("3.0.0")),
                            ("stringAttribute", string_attr("b")),
                        ],
                    ),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE2),
                    result(REQ1, DRIVER_A, POOL1, DEVICE3),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// An unknown constraint, and `distinctAttribute` with the attribute set or not.
fn distinct_attribute_cases() -> Vec<Case> {
    vec![
        Case {
            name: "unknown-constraint",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1)],
                vec![k8s_openapi::api::resource::v1::DeviceConstraint::default()],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Error("empty constraint (unsupported constraint type?)"),
            ..Default::default()
        },
        Case {
            name: "with-distinct-constraints",
            claims: vec![claim_with(
                CLAIM0,
                vec![
                    request(REQ0, CLASS_A, 1),
                    request(REQ1, CLASS_A, 1),
                    request(REQ2, CLASS_A, 1),
                    request(REQ3, CLASS_A, 1),
                ],
                vec![
                    distinct_attribute(BOOL_ATTRIBUTE, &[REQ0, REQ1]),
                    distinct_attribute(VERSION_ATTRIBUTE, &[REQ0, REQ1, REQ2]),
                    distinct_attribute(INT_ATTRIBUTE, &[REQ0, REQ1, REQ2, REQ3]),
                ],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![
                    multi(full_attrs(DEVICE1, "1.0.0", 0, "x", true)),
                    multi(full_attrs(DEVICE2, "1.0.1", 1, "x", false)),
                    multi(full_attrs(DEVICE3, "1.0.2", 2, "x", true)),
                    multi(full_attrs(DEVICE4, "1.0.0", 3, "x", true)),
                ],
            )],
            expect: Expect::Results(vec![allocation(
                Some(local(NODE1)),
                vec![
                    shared(result(REQ0, DRIVER_A, POOL1, DEVICE1), &[]),
                    shared(result(REQ1, DRIVER_A, POOL1, DEVICE2), &[]),
                    shared(result(REQ2, DRIVER_A, POOL1, DEVICE3), &[]),
                    shared(result(REQ3, DRIVER_A, POOL1, DEVICE4), &[]),
                ],
            )]),
            ..Default::default()
        },
        Case {
            name: "with-distinct-constraints-attribute-not-set",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1)],
                vec![distinct_attribute(BOOL_ATTRIBUTE, &[REQ0])],
                vec![],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(
                SLICE1,
                NODE1,
                POOL1,
                DRIVER_A,
                vec![multi(device(DEVICE1))],
            )],
            expect: Expect::UnsatisfiableBecause(
                "distinctAttribute driver-a/boolAttribute: 1 needed",
            ),
            ..Default::default()
        },
    ]
}

/// `matchAttribute` on list attributes (and a scalar against a list).
fn list_attribute_match_cases() -> Vec<Case> {
    vec![
        Case {
            name: "list-attributes-match-constaint-list-of-string-values-with-common-elements",
            claims: two_of_req0(match_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[(
                        "stringAttribute",
                        strings_attr(&["value1", "value2", "value3"]),
                    )],
                ),
                attrs(
                    device(DEVICE2),
                    &[(
                        "stringAttribute",
                        strings_attr(&["value2", "value3", "value4"]),
                    )],
                ),
            ),
            expect: both(DEVICE1, DEVICE2),
            ..Default::default()
        },
        Case {
            name: "list-attributes-match-constaint-list-of-string-values-without-common-elements",
            claims: two_of_req0(match_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[("stringAttribute", strings_attr(&["value1", "value2"]))],
                ),
                attrs(
                    device(DEVICE2),
                    &[("stringAttribute", strings_attr(&["value3", "value4"]))],
                ),
            ),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
        Case {
            name: "list-attributes-match-constaint-mixed-scalar-and-list-of-string-values-with-common-elements",
            claims: two_of_req0(match_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[("stringAttribute", string_attr("value2"))],
                ),
                attrs(
                    device(DEVICE2),
                    &[("stringAttribute", strings_attr(&["value1", "value2"]))],
                ),
            ),
            expect: both(DEVICE1, DEVICE2),
            ..Default::default()
        },
    ]
}

/// `distinctAttribute` on list attributes.
fn list_attribute_distinct_cases() -> Vec<Case> {
    vec![
        Case {
            name: "list-attributes-distinct-constraint-list-of-string-values-all-distinct",
            claims: two_of_req0(distinct_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[("stringAttribute", strings_attr(&["value1", "value2"]))],
                ),
                attrs(
                    device(DEVICE2),
                    &[("stringAttribute", strings_attr(&["value3", "value4"]))],
                ),
            ),
            expect: both(DEVICE1, DEVICE2),
            ..Default::default()
        },
        Case {
            name: "list-attributes-distinct-constraint-list-of-string-values-with-common-elements",
            claims: two_of_req0(distinct_attribute(STRING_ATTRIBUTE, &[])),
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: pair(
                attrs(
                    device(DEVICE1),
                    &[(
                        "stringAttribute",
                        strings_attr(&["value1", "value2", "value3"]),
                    )],
                ),
                attrs(
                    device(DEVICE2),
                    &[(
                        "stringAttribute",
                        strings_attr(&["value2", "value4", "value5"]),
                    )],
                ),
            ),
            expect: Expect::Unsatisfiable,
            ..Default::default()
        },
    ]
}

/// Device configuration from the class, for one and several requests.
fn class_config_cases() -> Vec<Case> {
    vec![
        Case {
            name: "with-class-device-config",
            claims: vec![simple_claim(CLAIM0, REQ0, CLASS_A)],
            classes: vec![class_with_config(CLASS_A, DRIVER_A, "classAttribute")],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
                vec![config("FromClass", &[], DRIVER_A, "classAttribute")],
            )]),
            ..Default::default()
        },
        Case {
            name: "with-class-device-config-with-multiple-request-and-configs",
            claims: vec![claim(
                CLAIM0,
                vec![
                    request(REQ0, CLASS_A, 1),
                    request(REQ1, CLASS_A, 1),
                    request(REQ2, CLASS_B, 1),
                ],
            )],
            classes: vec![
                class_with_config(CLASS_A, DRIVER_A, "classAttribute-A"),
                class_with_config(CLASS_B, DRIVER_B, "classAttribute-B"),
            ],
            slices: vec![
                node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(2)),
                node_slice(SLICE2, NODE1, POOL1, DRIVER_B, vec![device(DEVICE1)]),
            ],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE0),
                    result(REQ1, DRIVER_A, POOL1, DEVICE1),
                    result(REQ2, DRIVER_B, POOL1, DEVICE1),
                ],
                vec![
                    config("FromClass", &[REQ0, REQ1], DRIVER_A, "classAttribute-A"),
                    config("FromClass", &[REQ2], DRIVER_B, "classAttribute-B"),
                ],
            )]),
            ..Default::default()
        },
    ]
}

/// Device configuration from the claim.
fn claim_config_cases() -> Vec<Case> {
    vec![
        Case {
            name: "with-claim-config-for-two-requests",
            claims: vec![claim_with(
                CLAIM0,
                vec![
                    request(REQ0, CLASS_A, 1),
                    request(REQ1, CLASS_A, 1),
                    request(REQ2, CLASS_A, 1),
                ],
                vec![],
                vec![claim_config(&[REQ0, REQ1], DRIVER_A, "deviceAttribute")],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![node_slice(SLICE1, NODE1, POOL1, DRIVER_A, devices(3))],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![
                    result(REQ0, DRIVER_A, POOL1, DEVICE0),
                    result(REQ1, DRIVER_A, POOL1, DEVICE1),
                    result(REQ2, DRIVER_A, POOL1, DEVICE2),
                ],
                vec![config(
                    "FromClaim",
                    &[REQ0, REQ1],
                    DRIVER_A,
                    "deviceAttribute",
                )],
            )]),
            ..Default::default()
        },
        Case {
            name: "claim-with-device-config",
            claims: vec![claim_with(
                CLAIM0,
                vec![request(REQ0, CLASS_A, 1)],
                vec![],
                vec![claim_config(&[], DRIVER_A, "deviceAttribute")],
            )],
            classes: vec![class(CLASS_A, DRIVER_A)],
            slices: vec![one_device_slice(SLICE1, POOL1, DRIVER_A)],
            expect: Expect::Results(vec![allocation_with_config(
                Some(local(NODE1)),
                vec![result(REQ0, DRIVER_A, POOL1, DEVICE1)],
                vec![config("FromClaim", &[], DRIVER_A, "deviceAttribute")],
            )]),
            ..Default::default()
        },
    ]
}
