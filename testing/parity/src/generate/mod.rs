//! A seeded generator of small allocation problems covering every feature the structured
//! allocator implements: class and request CEL selectors (matching, not matching, failing at
//! run time, failing to compile, version attributes compared right and wrong), `ExactCount` and
//! `All`, `firstAvailable`, admin access, `matchAttribute` / `distinctAttribute`, taints and
//! tolerations, partitionable devices (counter sets in their own slices, devices consuming them,
//! dangling references), consumable capacity (multi-allocatable devices, request policies,
//! capacity requests), shared and per-device node selection, binding conditions, incomplete,
//! invalid and outdated pools, claims already in use (exclusive, admin access, shared), missing
//! DeviceClasses and class / claim configuration.
//!
//! The same seed and switches always give the same instances (ChaCha8).
//!
//! Objects are what the API server would store (defaults applied, names valid), except where a
//! field says otherwise: compile errors and slices carrying both devices and counters can only
//! come from older or newer API servers, and the allocator must still answer for them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements,
    Counter, CounterSet, Device, DeviceAllocationResult, DeviceAttribute, DeviceCapacity,
    DeviceClaim, DeviceClaimConfiguration, DeviceClass, DeviceClassConfiguration, DeviceClassSpec,
    DeviceConstraint, DeviceCounterConsumption, DeviceRequest, DeviceRequestAllocationResult,
    DeviceSelector, DeviceSubRequest, DeviceTaint, DeviceToleration, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimSpec, ResourceClaimStatus, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use tessera_test_support::objects::{bool_attr, cel_selector as selector, int_attr, string_attr};

use crate::instance::{Instance, apply_defaults};

pub mod adversarial;

/// Switches for the deliberate deviations (docs/ARCHITECTURE.md, "Where the allocator
/// deliberately differs from upstream"). Off, the generator never produces an instance that
/// exercises the deviation; on, it may. [`Switches::disable`] turns one off on an existing
/// instance, which is how a difference is attributed to a deviation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    /// A device that is not multi-allocatable but has shared allocations (results with a share
    /// ID) in the state: Tessera counts it as in use, upstream allocates it again.
    pub shared_non_multi: bool,
    /// Search problems too large for upstream's 10 s Filter timeout, which Tessera decides
    /// within its bound (upstream: timeout error; Tessera: the answer), generated marked as
    /// adversarial ([`adversarial`]); the job checks Tessera's answer against the reference
    /// allocator's. An ordinary instance that times out upstream fails the job.
    pub adversarial: bool,
}

/// The deviations, by the name the CLI and the docs use.
pub const DEVIATIONS: &[&str] = &["shared-non-multi", "adversarial"];

impl Switches {
    /// All deviations on.
    pub fn all() -> Switches {
        Switches {
            shared_non_multi: true,
            adversarial: true,
        }
    }

    /// Turns one deviation on by name.
    pub fn enable(&mut self, name: &str) -> anyhow::Result<()> {
        match name {
            "shared-non-multi" => self.shared_non_multi = true,
            "adversarial" => self.adversarial = true,
            other => anyhow::bail!(
                "unknown deviation {other}; known: {}",
                DEVIATIONS.join(", ")
            ),
        }
        Ok(())
    }

    /// Removes what exercises deviation `name` from an instance (the instance is otherwise
    /// unchanged): a difference that disappears is explained by that deviation.
    pub fn disable(name: &str, instance: &mut Instance) {
        if name == "shared-non-multi" {
            let multi: std::collections::HashSet<(String, String, String)> = instance
                .slices
                .iter()
                .flat_map(|s| {
                    s.spec
                        .devices
                        .iter()
                        .flatten()
                        .filter(|d| d.allow_multiple_allocations.unwrap_or(false))
                        .map(move |d| {
                            (
                                s.spec.driver.clone(),
                                s.spec.pool.name.clone(),
                                d.name.clone(),
                            )
                        })
                })
                .collect();
            for claim in &mut instance.allocated_claims {
                let results = claim
                    .status
                    .as_mut()
                    .and_then(|s| s.allocation.as_mut())
                    .and_then(|a| a.devices.as_mut())
                    .and_then(|d| d.results.as_mut());
                for r in results.into_iter().flatten() {
                    let key = (r.driver.clone(), r.pool.clone(), r.device.clone());
                    if r.share_id.is_some() && !multi.contains(&key) {
                        r.share_id = None;
                        r.consumed_capacity = None;
                    }
                }
            }
        }
        // Adversarial instances are only ever generated on purpose (marked): nothing to strip.
    }
}

const DRIVERS: &[&str] = &["driver-a", "driver-b"];
const MODELS: &[&str] = &["a100", "h100", "l40"];
const VERSIONS: &[&str] = &["1.0.0", "1.2.3", "2.0.0", "2.0.0-rc.1"];
const MEMORY: &[&str] = &["1Gi", "2Gi", "4Gi", "8Gi"];
const TAINT_KEYS: &[&str] = &["example.com/k1", "example.com/k2"];

/// Class selectors that never fail. `{d}` is replaced by a driver.
const CLASS_SELECTORS: &[&str] = &[
    "device.driver == \"{d}\"",
    "true",
    "device.allowMultipleAllocations == true",
    "device.allowMultipleAllocations == false",
    "\"model\" in device.attributes[\"{d}\"] && device.attributes[\"{d}\"].model != \"l40\"",
    "has(device.attributes[\"{d}\"].healthy) && device.attributes[\"{d}\"].healthy",
    "device.attributes[\"{d}\"].?driverVersion.orValue(semver(\"0.0.0\")).isGreaterThan(semver(\"1.1.0\"))",
];

/// Class selectors that fail at run time on some devices (a missing attribute or capacity).
const RISKY_CLASS_SELECTORS: &[&str] = &[
    "device.attributes[\"{d}\"].model == \"h100\"",
    "device.attributes[\"{d}\"].driverVersion.isGreaterThan(semver(\"1.1.0\"))",
    "device.capacity[\"{d}\"].memory.compareTo(quantity(\"2Gi\")) >= 0",
];

/// Request selectors that never fail. `{d}` is replaced by a driver.
const REQUEST_SELECTORS: &[&str] = &[
    "device.attributes[\"{d}\"].?numa.orValue(-1) == 1",
    "device.attributes[\"{d}\"].?numa.orValue(-1) == 0",
    "\"driverVersion\" in device.attributes[\"{d}\"] && device.attributes[\"{d}\"].driverVersion.isLessThan(semver(\"2.0.0\"))",
    "device.attributes[\"{d}\"].?model.orValue(\"\") in [\"a100\", \"h100\"]",
    "device.attributes[\"{d}\"].?index.orValue(0) % 2 == 0",
    "\"memory\" in device.capacity[\"{d}\"] && device.capacity[\"{d}\"].memory.isGreaterThan(quantity(\"1Gi\"))",
    "device.attributes[\"example.com\"].?zone.orValue(\"\") == \"z1\"",
    "!device.attributes[\"{d}\"].?healthy.orValue(true)",
    "device.attributes[\"{d}\"].driverVersion in [semver(\"1.0.0\"), semver(\"2.0.0\")] || true",
];

/// Request selectors that fail at run time on some devices, or do not compile (the last).
const RISKY_REQUEST_SELECTORS: &[&str] = &[
    "device.attributes[\"{d}\"].numa == 0",
    "device.attributes[\"{d}\"].model in [\"a100\", \"h100\"]",
    "device.attributes[\"{d}\"].driverVersion.major() >= 2",
    // A version compared with what is not a version: upstream fails at run time.
    "device.attributes[\"{d}\"].driverVersion == 1",
    "device.attributes[\"{d}\"].driverVersion == \"1.0.0\"",
    "device.attributes[\"{d}\"].driverVersion in [semver(\"1.0.0\"), semver(\"2.0.0\")]",
    "device.attributes[\"{d}\"].driverVersion in [1, 2]",
    // Does not compile (only an older or newer API server could have stored it).
    "device.attributes[\"{d}\"].numa ==",
];

const CONSTRAINT_ATTRIBUTES: &[&str] = &[
    "driver-a/numa",
    "driver-a/model",
    "driver-a/driverVersion",
    "driver-b/numa",
    "example.com/zone",
    "driver-a/noSuchAttribute",
];

/// Generates instances from a seed.
pub struct Generator {
    rng: ChaCha8Rng,
    seed: u64,
    switches: Switches,
    count: u64,
}

/// One device being built, with where it lives.
struct DeviceDraft {
    device: Device,
    multi: bool,
}

impl Generator {
    /// A generator for `seed` with deviations `switches`.
    pub fn new(seed: u64, switches: Switches) -> Generator {
        Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            switches,
            count: 0,
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        items.choose(&mut self.rng).expect("non-empty")
    }

    fn pick_str(&mut self, items: &[&'static str]) -> &'static str {
        items.choose(&mut self.rng).copied().expect("non-empty")
    }

    /// The next instance.
    pub fn instance(&mut self) -> Instance {
        self.count += 1;
        let name = format!("seed-{}-{}", self.seed, self.count);
        let mut inst = if self.switches.adversarial && self.chance(0.02) {
            if self.chance(0.5) {
                self.adversarial(name)
            } else {
                self.wide(name)
            }
        } else {
            self.ordinary(name)
        };
        apply_defaults(&mut inst);
        inst
    }

    fn ordinary(&mut self, name: String) -> Instance {
        let node_count = self.rng.random_range(1..=3);
        let nodes: Vec<Node> = (1..=node_count)
            .map(|i| {
                let region = if self.chance(0.5) { "r1" } else { "r2" };
                node(&format!("node-{i}"), region)
            })
            .collect();
        let mut slices = Vec::new();
        for n in &nodes {
            let pools = self.rng.random_range(1..=2);
            for p in 0..pools {
                let pool = format!("{}-pool-{p}", n.metadata.name.as_deref().unwrap_or("?"));
                self.pool(&mut slices, &pool, Placement::Node(node_name(n)));
            }
        }
        if self.chance(0.3) {
            let placement = match self.rng.random_range(0..3) {
                0 => Placement::AllNodes,
                1 => Placement::Region(if self.chance(0.5) { "r1" } else { "r2" }.into()),
                _ => Placement::PerDevice(
                    nodes
                        .iter()
                        .map(node_name)
                        .chain(["node-9".to_owned()])
                        .collect(),
                ),
            };
            self.pool(&mut slices, "shared-pool", placement);
        }
        let classes = self.classes();
        let class_names: Vec<String> = classes
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        let devices: Vec<(String, String, Device)> = slices
            .iter()
            .flat_map(|s| {
                s.spec
                    .devices
                    .iter()
                    .flatten()
                    .map(move |d| (s.spec.driver.clone(), s.spec.pool.name.clone(), d.clone()))
            })
            .collect();
        let allocated_claims = self.allocated_claims(&devices);
        let claim_count = if self.chance(0.6) {
            1
        } else {
            self.rng.random_range(2..=3)
        };
        let claims = (0..claim_count)
            .map(|i| self.claim(&format!("claim-{i}"), &class_names))
            .collect();
        Instance {
            name,
            nodes,
            slices,
            classes,
            claims,
            allocated_claims,
            ..Default::default()
        }
    }

    /// A pool: one or two device slices, maybe a counter slice; sometimes incomplete, invalid
    /// or with an outdated generation beside it.
    fn pool(&mut self, slices: &mut Vec<ResourceSlice>, pool: &str, placement: Placement) {
        let driver = if self.chance(0.75) {
            DRIVERS[0]
        } else {
            DRIVERS[1]
        }
        .to_owned();
        let generation = 2;
        let device_slices = self.rng.random_range(1..=2);
        let counters = self.chance(0.25);
        let combined_counters = counters && self.chance(0.1);
        let separate_counter_slice = counters && !combined_counters;
        let mut count = device_slices + usize::from(separate_counter_slice);
        let declared = if self.chance(0.03) { count + 1 } else { count };
        let counter_sets = if counters {
            vec![CounterSet {
                name: "gpu-0-counters".into(),
                counters: [
                    (
                        "memory".to_owned(),
                        counter(self.pick_str(&["4Gi", "8Gi", "16Gi"])),
                    ),
                    ("sm".to_owned(), counter(self.pick_str(&["2", "4", "7"]))),
                ]
                .into(),
            }]
        } else {
            Vec::new()
        };
        let mut used_names: Vec<String> = Vec::new();
        // At most one broken device per pool: a duplicate name or a dangling counter reference
        // (either makes the pool invalid).
        let mut duplicate = self.chance(0.03);
        let mut dangling = counters && self.chance(0.03);
        for s in 0..device_slices {
            let n = self.rng.random_range(1..=6);
            let mut devices = Vec::new();
            for _ in 0..n {
                let index = used_names.len();
                let mut name = format!("dev-{index}");
                if duplicate && !used_names.is_empty() {
                    name = self.pick(&used_names).clone(); // duplicate: invalid pool
                    duplicate = false;
                }
                used_names.push(name.clone());
                let mut draft = self.device(&name, &driver, index, counters, &placement);
                if dangling && let Some(c) = draft.device.consumes_counters.as_mut() {
                    c[0].counter_set = "no-such-set".into();
                    dangling = false;
                }
                devices.push(draft.device);
                let _ = draft.multi;
            }
            let mut spec = slice_spec(&driver, pool, generation, declared, &placement);
            spec.devices = Some(devices);
            if combined_counters && s == 0 {
                spec.shared_counters = Some(counter_sets.clone());
            }
            slices.push(slice(&format!("{pool}-slice-{s}"), spec));
        }
        if separate_counter_slice {
            let mut spec = slice_spec(&driver, pool, generation, declared, &placement);
            if let Placement::PerDevice(_) = placement {
                spec.per_device_node_selection = None;
                spec.all_nodes = Some(true);
            }
            spec.shared_counters = Some(counter_sets);
            slices.push(slice(&format!("{pool}-counters"), spec));
        }
        if self.chance(0.05) {
            // An outdated generation of the pool, which must be ignored.
            let mut spec = slice_spec(&driver, pool, generation - 1, 1, &placement);
            spec.devices = Some(vec![
                self.device("old-0", &driver, 0, false, &placement).device,
            ]);
            slices.push(slice(&format!("{pool}-old"), spec));
            count += 0;
        }
        let _ = count;
    }

    fn device(
        &mut self,
        name: &str,
        driver: &str,
        index: usize,
        counters: bool,
        placement: &Placement,
    ) -> DeviceDraft {
        // The draws happen in this order (the seeds' cases depend on it).
        let attributes = self.device_attributes(index);
        let multi = self.chance(0.15);
        let capacity = self.device_capacity(multi);
        let taints = self.device_taints();
        let consumes_counters = (counters && self.chance(0.8)).then(|| {
            vec![DeviceCounterConsumption {
                compatibility_groups: None,
                counter_set: "gpu-0-counters".into(),
                counters: [
                    ("memory".to_owned(), counter(self.pick_str(&["2Gi", "4Gi"]))),
                    ("sm".to_owned(), counter(self.pick_str(&["1", "2", "3"]))),
                ]
                .into(),
            }]
        });
        let mut device = Device {
            name: name.to_owned(),
            attributes: Some(attributes),
            capacity: (!capacity.is_empty()).then_some(capacity),
            allow_multiple_allocations: multi.then_some(true),
            taints,
            consumes_counters,
            ..Default::default()
        };
        if self.chance(0.04) {
            device.binding_conditions = Some(vec!["example.com/ready".into()]);
            device.binding_failure_conditions = Some(vec!["example.com/failed".into()]);
        }
        if self.chance(0.04) {
            device.binds_to_node = Some(true);
        }
        if let Placement::PerDevice(nodes) = placement {
            match self.rng.random_range(0..3) {
                0 => device.node_name = Some(self.pick(nodes).clone()),
                1 => device.all_nodes = Some(true),
                _ => {
                    device.node_selector =
                        Some(region_selector(if self.chance(0.5) { "r1" } else { "r2" }))
                }
            }
        }
        let _ = driver;
        DeviceDraft { device, multi }
    }

    /// A device's attributes: mostly well-typed, each present by chance, `index` always.
    fn device_attributes(&mut self, index: usize) -> BTreeMap<String, DeviceAttribute> {
        let mut attributes = BTreeMap::new();
        if self.chance(0.85) {
            attributes.insert("model".to_owned(), string_attr(self.pick_str(MODELS)));
        } else if self.chance(0.2) {
            attributes.insert("model".to_owned(), int_attr(7)); // wrong type
        }
        if self.chance(0.9) {
            attributes.insert("numa".to_owned(), int_attr(self.rng.random_range(0..=1)));
        }
        attributes.insert("index".to_owned(), int_attr(index as i64));
        if self.chance(0.7) {
            attributes.insert("healthy".to_owned(), bool_attr(self.chance(0.8)));
        }
        if self.chance(0.8) {
            attributes.insert(
                "driverVersion".to_owned(),
                DeviceAttribute {
                    version: Some((self.pick_str(VERSIONS)).to_owned()),
                    ..Default::default()
                },
            );
        }
        if self.chance(0.4) {
            attributes.insert(
                "example.com/zone".to_owned(),
                string_attr(self.pick_str(&["z1", "z2"])),
            );
        }
        attributes
    }

    /// A device's capacity: memory, always on a device that allows multiple allocations (which
    /// may carry a request policy).
    fn device_capacity(&mut self, multi: bool) -> BTreeMap<String, DeviceCapacity> {
        let mut capacity = BTreeMap::new();
        if self.chance(0.8) || multi {
            let value = q(self.pick_str(MEMORY));
            let request_policy = if multi { self.request_policy() } else { None };
            capacity.insert(
                "memory".to_owned(),
                DeviceCapacity {
                    value,
                    request_policy,
                },
            );
        }
        capacity
    }

    /// None, a range with optional max and step, or a list of valid values.
    fn request_policy(&mut self) -> Option<CapacityRequestPolicy> {
        match self.rng.random_range(0..3) {
            0 => None,
            1 => Some(CapacityRequestPolicy {
                default: Some(q("1Gi")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("1Gi"),
                    max: self.chance(0.5).then(|| q("4Gi")),
                    step: self.chance(0.5).then(|| q("1Gi")),
                }),
                valid_values: None,
            }),
            _ => Some(CapacityRequestPolicy {
                default: Some(q("1Gi")),
                valid_range: None,
                valid_values: Some(vec![q("1Gi"), q("2Gi"), q("4Gi")]),
            }),
        }
    }

    fn device_taints(&mut self) -> Option<Vec<DeviceTaint>> {
        self.chance(0.06).then(|| {
            vec![DeviceTaint {
                key: (self.pick_str(TAINT_KEYS)).to_owned(),
                value: self.chance(0.5).then(|| "v1".to_owned()),
                effect: (self.pick_str(&["NoSchedule", "NoExecute", "None"])).to_owned(),
                time_added: None,
            }]
        })
    }

    fn classes(&mut self) -> Vec<DeviceClass> {
        let mut out = Vec::new();
        for (i, driver) in DRIVERS.iter().enumerate() {
            out.push(class(
                &format!("class-{}", ['a', 'b'][i]),
                vec![format!("device.driver == \"{driver}\"")],
                self.chance(0.2),
            ));
        }
        let extra = self.rng.random_range(0..=2);
        for i in 0..extra {
            let n = self.rng.random_range(1..=2);
            let driver = self.pick_str(DRIVERS);
            let selectors = (0..n)
                .map(|_| {
                    let list = if self.chance(0.15) {
                        RISKY_CLASS_SELECTORS
                    } else {
                        CLASS_SELECTORS
                    };
                    self.pick_str(list).replace("{d}", driver)
                })
                .collect();
            let config = self.chance(0.3);
            out.push(class(&format!("class-x{i}"), selectors, config));
        }
        out
    }

    fn class_name(&mut self, classes: &[String]) -> String {
        if self.chance(0.004) {
            "no-such-class".into()
        } else {
            // Mostly the driver-a class, as most devices are driver-a's.
            match self.rng.random_range(0..10) {
                0..=5 => classes[0].clone(),
                6 => classes[1].clone(),
                _ => self.pick(classes).clone(),
            }
        }
    }

    fn selectors(&mut self, max: usize) -> Option<Vec<DeviceSelector>> {
        if self.chance(0.5) {
            return None;
        }
        let n = self.rng.random_range(1..=max);
        let driver = self.pick_str(DRIVERS);
        Some(
            (0..n)
                .map(|_| {
                    let expression = if self.chance(0.06) {
                        // The last (compile error) entry is the rarest.
                        let risky = RISKY_REQUEST_SELECTORS;
                        if self.chance(0.1) {
                            risky[risky.len() - 1]
                        } else {
                            risky[self.rng.random_range(0..risky.len() - 1)]
                        }
                    } else {
                        self.pick_str(REQUEST_SELECTORS)
                    };
                    selector(&expression.replace("{d}", driver))
                })
                .collect(),
        )
    }

    fn tolerations(&mut self) -> Option<Vec<DeviceToleration>> {
        self.chance(0.15).then(|| {
            vec![DeviceToleration {
                key: self
                    .chance(0.8)
                    .then(|| (self.pick_str(TAINT_KEYS)).to_owned()),
                operator: Some((self.pick_str(&["Exists", "Equal"])).to_owned()),
                value: self.chance(0.5).then(|| "v1".to_owned()),
                effect: self
                    .chance(0.5)
                    .then(|| (self.pick_str(&["NoSchedule", "NoExecute"])).to_owned()),
                toleration_seconds: None,
            }]
        })
    }

    fn capacity(&mut self) -> Option<CapacityRequirements> {
        self.chance(0.15).then(|| CapacityRequirements {
            requests: Some(
                [(
                    "memory".to_owned(),
                    q(self.pick_str(&["512Mi", "1Gi", "1536Mi", "3Gi"])),
                )]
                .into(),
            ),
        })
    }

    fn mode_and_count(&mut self) -> (String, Option<i64>) {
        if self.chance(0.05) {
            ("All".into(), None)
        } else {
            let count = if self.chance(0.03) {
                self.rng.random_range(4..=8)
            } else if self.chance(0.7) {
                1
            } else {
                2
            };
            ("ExactCount".into(), Some(count))
        }
    }

    fn claim(&mut self, name: &str, classes: &[String]) -> ResourceClaim {
        // The draws happen in this order (the seeds' cases depend on it).
        let request_count = if self.chance(0.6) {
            1
        } else {
            self.rng.random_range(2..=3)
        };
        let mut requests = Vec::new();
        // The names constraints and configs may list: requests and their subrequests.
        let mut names = Vec::new();
        for r in 0..request_count {
            let rname = format!("req-{r}");
            names.push(rname.clone());
            requests.push(self.request(rname, classes, &mut names));
        }
        let constraints = self.constraints(&names);
        let configs: Vec<DeviceClaimConfiguration> = if self.chance(0.2) {
            vec![DeviceClaimConfiguration {
                requests: self.subset(&names),
                opaque: Some(opaque("claim")),
            }]
        } else {
            Vec::new()
        };
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(requests),
                    constraints: (!constraints.is_empty()).then_some(constraints),
                    config: (!configs.is_empty()).then_some(configs),
                }),
            }),
            status: None,
        }
    }

    /// One request named `rname`: a prioritized list of subrequests (their names added to
    /// `names`) or an exact request.
    fn request(
        &mut self,
        rname: String,
        classes: &[String],
        names: &mut Vec<String>,
    ) -> DeviceRequest {
        if self.chance(0.2) {
            let subs = self.rng.random_range(1..=3);
            let first_available = (0..subs)
                .map(|s| {
                    let sub = format!("sub-{s}");
                    names.push(format!("{rname}/{sub}"));
                    let (mode, count) = self.mode_and_count();
                    DeviceSubRequest {
                        name: sub,
                        device_class_name: self.class_name(classes),
                        selectors: self.selectors(1),
                        allocation_mode: Some(mode),
                        count,
                        tolerations: self.tolerations(),
                        capacity: self.capacity(),
                        derived_attributes: None,
                    }
                })
                .collect();
            DeviceRequest {
                name: rname,
                exactly: None,
                first_available: Some(first_available),
            }
        } else {
            let (mode, count) = self.mode_and_count();
            DeviceRequest {
                name: rname,
                exactly: Some(ExactDeviceRequest {
                    device_class_name: self.class_name(classes),
                    selectors: self.selectors(2),
                    allocation_mode: Some(mode),
                    count,
                    admin_access: self.chance(0.08).then_some(true),
                    tolerations: self.tolerations(),
                    capacity: self.capacity(),
                    derived_attributes: None,
                }),
                first_available: None,
            }
        }
    }

    /// Up to two matchAttribute or distinctAttribute constraints over some of `names`.
    fn constraints(&mut self, names: &[String]) -> Vec<DeviceConstraint> {
        let constraint_count = if self.chance(0.35) {
            self.rng.random_range(1..=2)
        } else {
            0
        };
        (0..constraint_count)
            .map(|_| {
                let attribute = (self.pick_str(CONSTRAINT_ATTRIBUTES)).to_owned();
                let requests = self.subset(names);
                if self.chance(0.6) {
                    DeviceConstraint {
                        match_attribute: Some(attribute),
                        distinct_attribute: None,
                        requests,
                    }
                } else {
                    DeviceConstraint {
                        match_attribute: None,
                        distinct_attribute: Some(attribute),
                        requests,
                    }
                }
            })
            .collect()
    }

    /// Some request names (none: the constraint or config applies to all).
    fn subset(&mut self, names: &[String]) -> Option<Vec<String>> {
        if self.chance(0.4) {
            return None;
        }
        let chosen: Vec<String> = names.iter().filter(|_| self.chance(0.6)).cloned().collect();
        (!chosen.is_empty()).then_some(chosen)
    }

    /// Claims already allocated: devices in exclusive use, admin-access results (not in use) and
    /// shares of multi-allocatable devices with the capacity they consume.
    fn allocated_claims(&mut self, devices: &[(String, String, Device)]) -> Vec<ResourceClaim> {
        if devices.is_empty() {
            return Vec::new();
        }
        let n = self.rng.random_range(0..=2);
        (0..n)
            .map(|i| {
                let k = self.rng.random_range(1..=3);
                let results = (0..k)
                    .map(|_| {
                        let (driver, pool, device) = self.pick(devices).clone();
                        let multi = device.allow_multiple_allocations.unwrap_or(false);
                        let admin = self.chance(0.1);
                        let shared = !admin
                            && (multi || (self.switches.shared_non_multi && self.chance(0.1)));
                        DeviceRequestAllocationResult {
                            request: "req-0".into(),
                            driver,
                            pool,
                            device: device.name,
                            admin_access: admin.then_some(true),
                            share_id: shared
                                .then(|| format!("share-{i}-{}", self.rng.random::<u16>())),
                            consumed_capacity: (shared && self.chance(0.7)).then(|| {
                                [("memory".to_owned(), q(self.pick_str(&["1Gi", "2Gi"])))].into()
                            }),
                            ..Default::default()
                        }
                    })
                    .collect();
                ResourceClaim {
                    metadata: ObjectMeta {
                        name: Some(format!("in-use-{i}")),
                        namespace: Some("default".into()),
                        uid: Some(format!("uid-in-use-{i}")),
                        ..Default::default()
                    },
                    spec: None,
                    status: Some(ResourceClaimStatus {
                        allocation: Some(AllocationResult {
                            devices: Some(DeviceAllocationResult {
                                results: Some(results),
                                config: None,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }
            })
            .collect()
    }

    /// Many interchangeable devices and a claim that cannot be (or can only just be) satisfied
    /// because of a constraint: a wide search that upstream decides in time.
    fn wide(&mut self, name: String) -> Instance {
        let n = self.rng.random_range(24..=40);
        let devices = (0..n)
            .map(|i| Device {
                name: format!("dev-{i}"),
                attributes: Some(
                    [
                        ("numa".to_owned(), int_attr((i % 8) as i64)),
                        ("index".to_owned(), int_attr(i as i64)),
                    ]
                    .into(),
                ),
                ..Default::default()
            })
            .collect();
        let mut spec = slice_spec("driver-a", "big", 1, 1, &Placement::Node("node-1".into()));
        spec.devices = Some(devices);
        let want = self.rng.random_range(6..=12);
        let claim = ResourceClaim {
            metadata: ObjectMeta {
                name: Some("claim-0".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(vec![DeviceRequest {
                        name: "req-0".into(),
                        exactly: Some(ExactDeviceRequest {
                            device_class_name: "class-a".into(),
                            allocation_mode: Some("ExactCount".into()),
                            count: Some(want),
                            ..Default::default()
                        }),
                        first_available: None,
                    }]),
                    constraints: Some(vec![DeviceConstraint {
                        match_attribute: Some("driver-a/numa".into()),
                        distinct_attribute: None,
                        requests: None,
                    }]),
                    config: None,
                }),
            }),
            status: None,
        };
        Instance {
            name,
            nodes: vec![node("node-1", "r1")],
            slices: vec![slice("big-slice", spec)],
            classes: vec![class(
                "class-a",
                vec!["device.driver == \"driver-a\"".into()],
                false,
            )],
            claims: vec![claim],
            ..Default::default()
        }
    }
}

/// Expressions only the CEL comparison uses (beside the class and request selectors): the
/// corners of equality and list membership on versions and quantities.
const EXTRA_CEL: &[&str] = &[
    "device.attributes[\"{d}\"].driverVersion in [1, 2]",
    "device.attributes[\"{d}\"].driverVersion in [\"1.0.0\"]",
    "device.attributes[\"{d}\"].driverVersion in [semver(\"1.0.0\")]",
    "device.attributes[\"{d}\"].driverVersion == 1",
    "1 == device.attributes[\"{d}\"].driverVersion",
    "device.attributes[\"{d}\"].driverVersion != \"x\"",
    "device.attributes[\"{d}\"].driverVersion == null",
    "device.attributes[\"{d}\"].driverVersion == semver(\"1.0.0\")",
    "device.attributes[\"{d}\"].model in [1, 2]",
    "device.attributes[\"{d}\"].model == 7",
    "device.attributes[\"{d}\"].numa in [0, 1.0]",
    "device.attributes[\"{d}\"].numa == 0.0",
    "device.attributes[\"{d}\"].?driverVersion.orValue(semver(\"0.0.1\")).isLessThan(semver(\"1.5.0\"))",
    "device.capacity[\"{d}\"].memory == quantity(\"2Gi\")",
    "device.capacity[\"{d}\"].?memory.orValue(quantity(\"0\")).compareTo(quantity(\"2048Mi\")) == 0",
    "device.attributes[\"{d}\"].exists(k, k == \"model\")",
    "device.attributes[\"{d}\"].healthy",
    "device.attributes[\"{d}\"].index < 3 || device.attributes[\"{d}\"].nope",
    "device.attributes[\"{d}\"].nope || device.attributes[\"{d}\"].index < 3",
];

/// Expressions and devices for the CEL comparison: every selector the generator uses (for both
/// drivers) and the corner cases above, on the devices of a few generated instances.
pub fn cel_cases(seed: u64) -> (Vec<String>, Vec<crate::cel::CelDevice>) {
    let mut expressions = Vec::new();
    for d in DRIVERS {
        for e in CLASS_SELECTORS
            .iter()
            .chain(RISKY_CLASS_SELECTORS)
            .chain(REQUEST_SELECTORS)
            .chain(RISKY_REQUEST_SELECTORS)
            .chain(EXTRA_CEL)
        {
            expressions.push(e.replace("{d}", d));
        }
    }
    let mut g = Generator::new(seed, Switches::default());
    let mut devices = Vec::new();
    while devices.len() < 60 {
        for s in g.instance().slices {
            for d in s.spec.devices.into_iter().flatten() {
                devices.push(crate::cel::CelDevice {
                    driver: s.spec.driver.clone(),
                    device: d,
                });
            }
        }
    }
    (expressions, devices)
}

/// Request selectors, `None` for none.
fn selectors_of(expressions: &[&str]) -> Option<Vec<DeviceSelector>> {
    (!expressions.is_empty()).then(|| expressions.iter().map(|e| selector(e)).collect())
}

/// A claim in use holding one device whole.
fn in_use_claim(driver: &str, pool: &str, device: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("in-use-0".into()),
            namespace: Some("default".into()),
            uid: Some("uid-in-use-0".into()),
            ..Default::default()
        },
        spec: None,
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "req-0".into(),
                        driver: driver.into(),
                        pool: pool.into(),
                        device: device.into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A claim to allocate with these requests and constraints.
fn claim_of(
    name: &str,
    requests: Vec<DeviceRequest>,
    constraints: Vec<DeviceConstraint>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
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

/// Where a pool's slices are published.
enum Placement {
    Node(String),
    AllNodes,
    Region(String),
    PerDevice(Vec<String>),
}

fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn node(name: &str, region: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [("region", region), ("kubernetes.io/hostname", name)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn region_selector(region: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "region".into(),
                operator: "In".into(),
                values: Some(vec![region.into()]),
            }]),
            match_fields: None,
        }],
    }
}

fn slice_spec(
    driver: &str,
    pool: &str,
    generation: i64,
    count: usize,
    placement: &Placement,
) -> ResourceSliceSpec {
    let mut spec = ResourceSliceSpec {
        driver: driver.into(),
        pool: ResourcePool {
            name: pool.into(),
            generation,
            resource_slice_count: i64::try_from(count).unwrap_or(1),
        },
        ..Default::default()
    };
    match placement {
        Placement::Node(n) => spec.node_name = Some(n.clone()),
        Placement::AllNodes => spec.all_nodes = Some(true),
        Placement::Region(r) => spec.node_selector = Some(region_selector(r)),
        Placement::PerDevice(_) => spec.per_device_node_selection = Some(true),
    }
    spec
}

fn slice(name: &str, spec: ResourceSliceSpec) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec,
    }
}

fn class(name: &str, selectors: Vec<String>, config: bool) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(selectors.iter().map(|s| selector(s)).collect()),
            config: config.then(|| {
                vec![DeviceClassConfiguration {
                    opaque: Some(opaque(name)),
                }]
            }),
            ..Default::default()
        }),
    }
}

fn opaque(source: &str) -> OpaqueDeviceConfiguration {
    OpaqueDeviceConfiguration {
        driver: "driver-a".into(),
        parameters: RawExtension(serde_json::json!({ "source": source })),
    }
}

fn q(s: &str) -> Quantity {
    Quantity(s.to_owned())
}

fn counter(s: &str) -> Counter {
    Counter { value: q(s) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_instances() {
        let a: Vec<Instance> = {
            let mut g = Generator::new(7, Switches::default());
            (0..20).map(|_| g.instance()).collect()
        };
        let b: Vec<Instance> = {
            let mut g = Generator::new(7, Switches::default());
            (0..20).map(|_| g.instance()).collect()
        };
        assert_eq!(a, b);
        let c = Generator::new(8, Switches::default()).instance();
        assert_ne!(a[0], c);
    }

    #[test]
    fn without_the_switch_no_shared_allocation_of_an_exclusive_device() {
        let mut g = Generator::new(1, Switches::default());
        for _ in 0..500 {
            let mut inst = g.instance();
            let before = inst.clone();
            Switches::disable("shared-non-multi", &mut inst);
            assert_eq!(inst, before, "{}", inst.name);
        }
    }

    #[test]
    fn generated_instances_are_within_the_references_reach() {
        let mut g = Generator::new(5, Switches::all());
        let mut refused = Vec::new();
        let mut adversarial = 0;
        for _ in 0..400 {
            let i = g.instance();
            adversarial += u32::from(i.adversarial);
            let table = crate::reference::selectors::SelectorTable::tessera(&i);
            let options = crate::reference::Options::for_instance(&i);
            if let Err(beyond) = crate::reference::decide(&i, &table, options) {
                refused.push((i.name, beyond.0));
            }
        }
        assert!(refused.len() <= 4, "{refused:?}");
        assert!(adversarial > 0, "no adversarial instance in 400");
    }
}
