//! A device as the allocator indexes it: its identity, the published object, and the parts the
//! search needs parsed once (capacities with request policies, counter consumption, taints).

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::attribute::lookup_attribute;
use crate::quantity::{Amount, InvalidQuantity};
use crate::topology::TopologyAttributes;

/// A device's identity: driver, pool and device name (`driver/pool/device`). Cheap to clone and to
/// hash (the hash is computed once), because allocation checks ids in hash sets constantly.
#[derive(Clone, Debug)]
pub struct DeviceId {
    driver: Arc<str>,
    pool: Arc<str>,
    device: Arc<str>,
    hash: u64,
}

impl DeviceId {
    /// Builds an id from its three parts.
    pub fn new(driver: &str, pool: &str, device: &str) -> DeviceId {
        DeviceId::from_parts(driver.into(), pool.into(), device.into())
    }

    pub(crate) fn from_parts(driver: Arc<str>, pool: Arc<str>, device: Arc<str>) -> DeviceId {
        // FNV-1a over the three parts, separated so that ("ab", "c") and ("a", "bc") differ.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [&driver, &pool, &device] {
            for b in part.as_bytes().iter().chain([&0xffu8]) {
                hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        DeviceId {
            driver,
            pool,
            device,
            hash,
        }
    }

    /// The driver name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The pool name.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The pool name, shared.
    pub(crate) fn pool_name(&self) -> &Arc<str> {
        &self.pool
    }

    /// The device name.
    pub fn device(&self) -> &str {
        &self.device
    }
}

impl PartialEq for DeviceId {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.device == other.device
            && self.pool == other.pool
            && self.driver == other.driver
    }
}

impl Eq for DeviceId {}

impl std::hash::Hash for DeviceId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for DeviceId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DeviceId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.driver, &self.pool, &self.device).cmp(&(&other.driver, &other.pool, &other.device))
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A hasher for keys that hash themselves once ([`DeviceId`]): it keeps the last `u64` written.
#[derive(Default, Clone, Copy)]
pub(crate) struct PrehashedHasher(u64);

impl std::hash::Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Hash maps keyed by [`DeviceId`].
pub(crate) type BuildPrehashed = std::hash::BuildHasherDefault<PrehashedHasher>;

/// The position of a device in the cluster's device table ([`crate::cluster::Cluster`]).
pub(crate) type DevicePosition = usize;

/// A capacity rounding rule (`requestPolicy`) with its values parsed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RequestPolicy {
    pub default: Option<(Amount, Quantity)>,
    pub range: Option<PolicyRange>,
    pub valid_values: Vec<(Amount, Quantity)>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PolicyRange {
    pub min: (Amount, Quantity),
    pub max: Option<Amount>,
    pub step: Option<Amount>,
}

/// One published capacity of a device.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Capacity {
    pub name: String,
    pub value: Amount,
    pub raw: Quantity,
    pub policy: Option<RequestPolicy>,
}

/// Counters one device consumes from one counter set.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CounterConsumption {
    pub counter_set: String,
    pub counters: Vec<(String, Amount)>,
}

/// The parts of a device the search evaluates, parsed once.
#[derive(Clone, Debug, Default)]
pub(crate) struct ParsedDevice {
    pub capacities: Vec<Capacity>,
    pub consumes: Vec<CounterConsumption>,
    pub allow_multiple_allocations: bool,
}

/// A device of the inventory.
#[derive(Debug)]
pub(crate) struct DeviceEntry {
    pub id: DeviceId,
    pub slice: usize,
    pub device: Device,
    /// `Err` names the field whose quantity does not parse; such a device makes its pool invalid.
    pub parsed: Result<ParsedDevice, String>,
    pub topology: TopologyAttributes,
}

impl DeviceEntry {
    pub fn new(id: DeviceId, slice: usize, device: Device) -> DeviceEntry {
        let parsed = parse_device(&device);
        let topology = TopologyAttributes::from_device(id.driver(), &device);
        DeviceEntry {
            id,
            slice,
            device,
            parsed,
            topology,
        }
    }

    pub fn parsed(&self) -> &ParsedDevice {
        static EMPTY: ParsedDevice = ParsedDevice {
            capacities: Vec::new(),
            consumes: Vec::new(),
            allow_multiple_allocations: false,
        };
        self.parsed.as_ref().unwrap_or(&EMPTY)
    }

    pub fn taints(&self) -> &[k8s_openapi::api::resource::v1::DeviceTaint] {
        self.device.taints.as_deref().unwrap_or_default()
    }

    pub fn binds_to_node(&self) -> bool {
        self.device.binds_to_node.unwrap_or(false)
    }

    pub fn has_binding_conditions(&self) -> bool {
        self.device.binding_conditions.is_some()
    }

    /// `lookupAttribute` upstream: the fully qualified name, or the bare id when the domain is the
    /// device's driver.
    pub fn attribute(&self, qualified: &str) -> Option<&DeviceAttribute> {
        lookup_attribute(self.id.driver(), &self.device, qualified)
    }
}

fn parse_device(device: &Device) -> Result<ParsedDevice, String> {
    let field_err =
        |field: String, e: InvalidQuantity| format!("device {}: {field}: {e}", device.name);
    let mut capacities = Vec::new();
    for (name, cap) in device.capacity.iter().flatten() {
        capacities.push(
            parse_capacity(name, cap)
                .map_err(|(field, e)| field_err(format!("capacity {name}{field}"), e))?,
        );
    }
    let mut consumes = Vec::new();
    for c in device.consumes_counters.iter().flatten() {
        let mut counters = Vec::new();
        for (name, counter) in &c.counters {
            let value = Amount::from_quantity(&counter.value)
                .map_err(|e| field_err(format!("consumesCounters {}.{name}", c.counter_set), e))?;
            counters.push((name.clone(), value));
        }
        consumes.push(CounterConsumption {
            counter_set: c.counter_set.clone(),
            counters,
        });
    }
    Ok(ParsedDevice {
        capacities,
        consumes,
        allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
    })
}

fn parse_capacity(
    name: &str,
    cap: &DeviceCapacity,
) -> Result<Capacity, (&'static str, InvalidQuantity)> {
    let parse =
        |field: &'static str, q: &Quantity| Amount::from_quantity(q).map_err(|e| (field, e));
    let value = parse("", &cap.value)?;
    let policy = match &cap.request_policy {
        None => None,
        Some(p) => Some(RequestPolicy {
            default: p
                .default
                .as_ref()
                .map(|q| parse(".requestPolicy.default", q).map(|a| (a, q.clone())))
                .transpose()?,
            range: p
                .valid_range
                .as_ref()
                .map(
                    |r| -> Result<PolicyRange, (&'static str, InvalidQuantity)> {
                        Ok(PolicyRange {
                            min: (
                                parse(".requestPolicy.validRange.min", &r.min)?,
                                r.min.clone(),
                            ),
                            max: r
                                .max
                                .as_ref()
                                .map(|q| parse(".requestPolicy.validRange.max", q))
                                .transpose()?,
                            step: r
                                .step
                                .as_ref()
                                .map(|q| parse(".requestPolicy.validRange.step", q))
                                .transpose()?,
                        })
                    },
                )
                .transpose()?,
            valid_values: p
                .valid_values
                .iter()
                .flatten()
                .map(|q| parse(".requestPolicy.validValues", q).map(|a| (a, q.clone())))
                .collect::<Result<_, _>>()?,
        }),
    };
    Ok(Capacity {
        name: name.to_owned(),
        value,
        raw: cap.value.clone(),
        policy,
    })
}
