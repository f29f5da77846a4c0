//! Adversarial instances: upstream issue 131730's shape, built so that plain first fit must try
//! at least a billion combinations before it can answer — far past upstream's 10 s Filter
//! timeout — while the answer is plain to see: a request for `k` of `n` interchangeable devices
//! in front of a request that no device left by it can meet.
//!
//! | shape | the later request | answer | combinations first fit tries first |
//! |---|---|---|---|
//! | `class` | a class no device matches | unsatisfiable | C(n, k) |
//! | `in-use` | device 0, held by a claim in use | unsatisfiable (a second node, when there is one, fits) | C(n−1, k) |
//! | `tainted` | the last device, tainted `NoExecute`, not tolerated | unsatisfiable | C(n−1, k) |
//! | `counters` | the last device, which consumes more than its counter set holds | unsatisfiable | C(n−1, k) |
//! | `late-fit` | device 0 | allocated: devices 1…k, then device 0 | C(n−1, k−1) |
//! | `constraint` | the one device of another model, under `matchAttribute` on the model | unsatisfiable | C(n−1, k) |
//!
//! Upstream tries at most a few million combinations a second, so the job stops its Filter on
//! these after [`CUT_MILLIS`] instead of 10 s: a billion combinations take minutes either way,
//! and the verdict is the same timeout. Each instance is marked `adversarial`; only such an
//! instance may time out upstream, and the reference allocator decides it instead.

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceConstraint, DeviceCounterConsumption, DeviceSelector,
    DeviceTaint, ResourceClaim, ResourceSlice,
};
use rand::Rng;

use tessera_test_support::objects::{int_attr, string_attr};

use super::{Generator, Placement, class, node, q, slice, slice_spec};
use crate::instance::Instance;

/// How long upstream's Filter runs on an adversarial instance.
pub const CUT_MILLIS: u64 = 500;

/// The fewest combinations an adversarial instance makes plain first fit try before it answers.
pub const LEAST_COMBINATIONS: u128 = 1_000_000_000;

/// The shapes, by name.
pub const SHAPES: [&str; 6] = [
    "class",
    "in-use",
    "tainted",
    "counters",
    "late-fit",
    "constraint",
];

/// `n` choose `k`.
pub fn choose(n: u32, k: u32) -> u128 {
    if k > n {
        return 0;
    }
    (0..k).fold(1u128, |acc, i| acc * u128::from(n - i) / u128::from(i + 1))
}

/// The combinations first fit tries before it answers, for a shape (see the table above).
pub fn combinations(shape: &str, n: u32, k: u32) -> u128 {
    match shape {
        "class" => choose(n, k),
        "late-fit" => choose(n - 1, k - 1),
        _ => choose(n - 1, k),
    }
}

impl Generator {
    /// An adversarial instance of a random shape.
    pub(super) fn adversarial(&mut self, name: String) -> Instance {
        let shape = SHAPES[self.rng.random_range(0..SHAPES.len())];
        let n: u32 = self.rng.random_range(40..=48);
        let k: u32 = self.rng.random_range(12..=14);
        assert!(
            combinations(shape, n, k) >= LEAST_COMBINATIONS,
            "{shape}: {n} devices, {k} wanted"
        );
        let second_node = matches!(shape, "in-use" | "late-fit") && self.chance(0.4);
        adversarial_instance(name, shape, n, k, second_node)
    }
}

/// What a shape makes of the big slice's `n` devices and the claim.
struct Shaped {
    devices: Vec<Device>,
    /// The selectors of the claim's request.
    later: Option<Vec<DeviceSelector>>,
    later_class: &'static str,
    constraints: Vec<DeviceConstraint>,
    allocated_claims: Vec<ResourceClaim>,
    counter_slice: Option<ResourceSlice>,
}

fn shaped(shape: &str, n: u32) -> Shaped {
    let last = n - 1;
    let mut devices: Vec<Device> = (0..n).map(|i| device(i, "a")).collect();
    let mut later = super::selectors_of(&[]);
    let mut later_class = "class-a";
    let mut constraints = Vec::new();
    let mut allocated_claims = Vec::new();
    let mut counter_slice = None;
    let index_is = |i: u32| format!("device.attributes[\"driver-a\"].index == {i}");
    match shape {
        "class" => later_class = "class-none",
        "in-use" => {
            later = super::selectors_of(&[&index_is(0)]);
            allocated_claims.push(super::in_use_claim("driver-a", "big", "dev-0"));
        }
        "tainted" => {
            later = super::selectors_of(&[&index_is(last)]);
            devices[last as usize].taints = Some(vec![DeviceTaint {
                key: "example.com/k1".into(),
                value: None,
                effect: "NoExecute".into(),
                time_added: None,
            }]);
        }
        "counters" => {
            later = super::selectors_of(&[&index_is(last)]);
            devices[last as usize].consumes_counters = Some(vec![DeviceCounterConsumption {
                compatibility_groups: None,
                counter_set: "gpu-0-counters".into(),
                counters: [("sm".to_owned(), Counter { value: q("8") })].into(),
            }]);
            let mut spec = slice_spec("driver-a", "big", 1, 2, &Placement::Node("node-1".into()));
            spec.shared_counters = Some(vec![CounterSet {
                name: "gpu-0-counters".into(),
                counters: [("sm".to_owned(), Counter { value: q("4") })].into(),
            }]);
            counter_slice = Some(slice("big-counters", spec));
        }
        "late-fit" => later = super::selectors_of(&[&index_is(0)]),
        _ => {
            devices[last as usize] = device(last, "b");
            later = super::selectors_of(&["device.attributes[\"driver-a\"].model == \"b\""]);
            constraints.push(DeviceConstraint {
                match_attribute: Some("driver-a/model".into()),
                distinct_attribute: None,
                requests: None,
            });
        }
    }
    Shaped {
        devices,
        later,
        later_class,
        constraints,
        allocated_claims,
        counter_slice,
    }
}

/// The instance of a shape with `n` devices and `k` wanted.
pub fn adversarial_instance(
    name: String,
    shape: &str,
    n: u32,
    k: u32,
    second_node: bool,
) -> Instance {
    let Shaped {
        devices,
        later,
        later_class,
        constraints,
        allocated_claims,
        counter_slice,
    } = shaped(shape, n);
    let declared = if counter_slice.is_some() { 2 } else { 1 };
    let mut spec = slice_spec(
        "driver-a",
        "big",
        1,
        declared,
        &Placement::Node("node-1".into()),
    );
    spec.devices = Some(devices);
    let mut slices = vec![slice("big-slice", spec)];
    slices.extend(counter_slice);
    let mut nodes = vec![node("node-1", "r1")];
    if second_node {
        let mut spec = slice_spec("driver-a", "small", 1, 1, &Placement::Node("node-2".into()));
        spec.devices = Some((0..=k).map(|i| device(i, "a")).collect());
        slices.push(slice("small-slice", spec));
        nodes.push(node("node-2", "r1"));
    }
    let claim = claim(k, later_class, later, constraints);
    Instance {
        name,
        nodes,
        slices,
        classes: vec![
            class(
                "class-a",
                vec!["device.driver == \"driver-a\"".into()],
                false,
            ),
            class(
                "class-none",
                vec!["device.driver == \"no-such-driver\"".into()],
                false,
            ),
        ],
        claims: vec![claim],
        allocated_claims,
        adversarial: true,
        filter_timeout_millis: Some(CUT_MILLIS),
        ..Default::default()
    }
}

fn device(i: u32, model: &str) -> Device {
    Device {
        name: format!("dev-{i}"),
        attributes: Some(
            [
                ("index".to_owned(), int_attr(i64::from(i))),
                ("numa".to_owned(), int_attr(i64::from(i % 8))),
                ("model".to_owned(), string_attr(model)),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

/// `req-0`: `k` devices of class-a; `req-1`: one device of `class` with `selectors`.
fn claim(
    k: u32,
    class: &str,
    selectors: Option<Vec<k8s_openapi::api::resource::v1::DeviceSelector>>,
    constraints: Vec<DeviceConstraint>,
) -> ResourceClaim {
    let mut first = tessera_test_support::objects::exact_request("req-0", "class-a", i64::from(k));
    let mut second = tessera_test_support::objects::exact_request("req-1", class, 1);
    if let Some(e) = second.exactly.as_mut() {
        e.selectors = selectors;
    }
    if let Some(e) = first.exactly.as_mut() {
        e.selectors = None;
    }
    super::claim_of("claim-0", vec![first, second], constraints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_needs_a_billion_combinations_at_its_smallest() {
        for shape in SHAPES {
            assert!(combinations(shape, 40, 12) >= LEAST_COMBINATIONS, "{shape}");
        }
        assert_eq!(choose(5, 2), 10);
        assert_eq!(choose(40, 12), 5_586_853_480);
    }
}
