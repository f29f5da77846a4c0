//! Table cases mirroring upstream's shared allocator tests
//! (k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting/allocator_testing.go).
//! Each case carries the upstream case name; the expectations are upstream's, translated:
//! nil results → `Unsatisfiable`, "invalid resource pools were encountered" → unsatisfiable with an
//! invalid pool in the explanation, other errors → `Error` with the same message fragment.

#[path = "../support/mod.rs"]
mod support;

mod all_and_admin;
mod basic;
mod constraints_and_config;
mod partitionable;
mod prioritized_list;
mod recorded;
mod taints_and_capacity;

#[test]
fn basic() {
    support::run(basic::cases());
}

#[test]
fn all_and_admin_access() {
    support::run(all_and_admin::cases());
}

#[test]
fn constraints_and_config() {
    support::run(constraints_and_config::cases());
}

#[test]
fn prioritized_list() {
    support::run(prioritized_list::cases());
}

#[test]
fn partitionable_devices() {
    support::run(partitionable::cases());
}

#[test]
fn taints_and_consumable_capacity() {
    support::run(taints_and_capacity::cases());
}

#[test]
fn at_least_forty_upstream_cases() {
    let total = basic::cases().len()
        + all_and_admin::cases().len()
        + constraints_and_config::cases().len()
        + prioritized_list::cases().len()
        + partitionable::cases().len()
        + taints_and_capacity::cases().len();
    assert!(total >= 40, "only {total} upstream cases");
}
