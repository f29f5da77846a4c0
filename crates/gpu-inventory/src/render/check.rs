//! The API server's validation of ResourceSlices (`resource.k8s.io/v1`, upstream-facts.md), checked
//! before a slice is published so that a bad slice is an error here, naming the field, rather than
//! a rejected write in the node plugin.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CounterSet, Device, DeviceAttribute, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_api::validation::{
    MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE, MAX_COUNTERS_PER_SET, MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS, MAX_POOL_NAME_LENGTH, check_qualified_name,
    check_string_value, check_version_value, is_dns_label, is_dns_subdomain,
};

use super::ServerVersion;

/// Longest driver name.
pub const MAX_DRIVER_NAME_LENGTH: usize = 63;
/// Most counter sets in one slice (1.35+).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Most counters over all counter sets of one slice (1.34).
pub const MAX_SHARED_COUNTERS_PER_SLICE_1_34: usize = 32;
/// Most counters consumed by all devices of one slice together (1.34).
pub const MAX_CONSUMED_COUNTERS_PER_SLICE_1_34: usize = 1024;
/// Most counter consumptions (counter sets referenced) per device (1.35+).
pub const MAX_COUNTER_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Most binding conditions, and binding failure conditions, per device.
pub const MAX_BINDING_CONDITIONS: usize = 4;

/// One rule a slice breaks, at a field path such as `spec.devices[3].attributes[productName]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

#[derive(Default)]
pub(super) struct Violations(Vec<Violation>);

impl Violations {
    pub(super) fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn finish(self) -> Result<(), Vec<Violation>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

/// Checks one ResourceSlice against the API server's validation for `server`: names, node
/// selection, devices per slice, attributes and capacities per device, attribute values, taints,
/// counter sets and counter consumption. Returns every violation found.
pub fn check_slice(slice: &ResourceSlice, server: ServerVersion) -> Result<(), Vec<Violation>> {
    let mut v = Violations::default();
    match (&slice.metadata.name, &slice.metadata.generate_name) {
        (Some(name), _) if !is_dns_subdomain(name) => v.add(
            "metadata.name",
            format!("`{name}` is not a DNS subdomain (lower case, at most 253 characters)"),
        ),
        (None, None) => v.add("metadata.name", "a slice needs a name or a generateName"),
        _ => {}
    }
    let spec = &slice.spec;
    if spec.driver.len() > MAX_DRIVER_NAME_LENGTH || !is_dns_subdomain(&spec.driver) {
        v.add(
            "spec.driver",
            format!(
                "`{}` is not a DNS subdomain of at most {MAX_DRIVER_NAME_LENGTH} characters",
                spec.driver
            ),
        );
    }
    check_pool_fields(&mut v, slice);
    check_node_selection(&mut v, slice);
    let devices = spec.devices.as_deref().unwrap_or_default();
    let sets = spec.shared_counters.as_deref().unwrap_or_default();
    if server.splits_counters_from_devices() && !devices.is_empty() && !sets.is_empty() {
        v.add(
            "spec",
            format!(
                "from Kubernetes 1.35 a slice holds devices or sharedCounters, not both (server {server})"
            ),
        );
    }
    check_shared_counters(&mut v, sets, server);
    check_devices(&mut v, slice, devices, sets, server);
    v.finish()
}

fn check_pool_fields(v: &mut Violations, slice: &ResourceSlice) {
    let pool = &slice.spec.pool;
    if pool.name.is_empty()
        || pool.name.len() > MAX_POOL_NAME_LENGTH
        || !pool.name.split('/').all(is_dns_subdomain)
    {
        v.add(
            "spec.pool.name",
            format!(
                "`{}` must be DNS subdomains separated by `/`, at most {MAX_POOL_NAME_LENGTH} characters",
                pool.name
            ),
        );
    }
    if pool.generation < 0 {
        v.add("spec.pool.generation", "must not be negative");
    }
    if pool.resource_slice_count < 1 {
        v.add("spec.pool.resourceSliceCount", "must be at least 1");
    }
}

/// What the API server requires of a slice's node selector: exactly one term, and a `matchFields`
/// requirement with `In` or `NotIn` names exactly one value (several nodes are selected by a
/// label, with `matchExpressions`).
fn check_node_selector(v: &mut Violations, selector: &k8s_openapi::api::core::v1::NodeSelector) {
    if selector.node_selector_terms.len() != 1 {
        v.add(
            "spec.nodeSelector.nodeSelectorTerms",
            format!(
                "must have exactly one term ({} given)",
                selector.node_selector_terms.len()
            ),
        );
    }
    let fields = selector
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten());
    for requirement in fields {
        let values = requirement.values.as_ref().map_or(0, Vec::len);
        if matches!(requirement.operator.as_str(), "In" | "NotIn") && values != 1 {
            v.add(
                "spec.nodeSelector.nodeSelectorTerms[].matchFields[].values",
                format!(
                    "must be one value with operator {} ({values} given)",
                    requirement.operator
                ),
            );
        }
    }
}

fn check_node_selection(v: &mut Violations, slice: &ResourceSlice) {
    let spec = &slice.spec;
    let chosen = [
        spec.node_name.is_some(),
        spec.node_selector.is_some(),
        spec.all_nodes == Some(true),
        spec.per_device_node_selection == Some(true),
    ]
    .into_iter()
    .filter(|set| *set)
    .count();
    if chosen != 1 {
        v.add(
            "spec",
            format!(
                "exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection must be set ({chosen} are)"
            ),
        );
    }
    if let Some(selector) = &spec.node_selector {
        check_node_selector(v, selector);
    }
    if let Some(node) = &spec.node_name
        && !is_dns_subdomain(node)
    {
        v.add("spec.nodeName", format!("`{node}` is not a DNS subdomain"));
    }
}

fn check_shared_counters(v: &mut Violations, sets: &[CounterSet], server: ServerVersion) {
    if server.splits_counters_from_devices() && sets.len() > MAX_COUNTER_SETS_PER_SLICE {
        v.add(
            "spec.sharedCounters",
            format!(
                "{} counter sets, at most {MAX_COUNTER_SETS_PER_SLICE} are allowed per slice",
                sets.len()
            ),
        );
    }
    let total: usize = sets.iter().map(|s| s.counters.len()).sum();
    if !server.splits_counters_from_devices() && total > MAX_SHARED_COUNTERS_PER_SLICE_1_34 {
        v.add(
            "spec.sharedCounters",
            format!(
                "{total} counters over all sets, at most {MAX_SHARED_COUNTERS_PER_SLICE_1_34} are allowed per slice in 1.34"
            ),
        );
    }
    let mut names = BTreeSet::new();
    for (i, set) in sets.iter().enumerate() {
        let at = format!("spec.sharedCounters[{i}]");
        if !is_dns_label(&set.name) {
            v.add(
                format!("{at}.name"),
                format!("`{}` is not a DNS label", set.name),
            );
        }
        if !names.insert(&set.name) {
            v.add(
                format!("{at}.name"),
                format!("counter set `{}` is defined twice", set.name),
            );
        }
        check_counters(v, &format!("{at}.counters"), set.counters.keys());
        if set.counters.is_empty() {
            v.add(format!("{at}.counters"), "a counter set needs counters");
        }
    }
}

fn check_counters<'a>(
    v: &mut Violations,
    at: &str,
    names: impl ExactSizeIterator<Item = &'a String>,
) {
    if names.len() > MAX_COUNTERS_PER_SET {
        v.add(
            at,
            format!(
                "{} counters, at most {MAX_COUNTERS_PER_SET} are allowed",
                names.len()
            ),
        );
    }
    for name in names {
        if !is_dns_label(name) {
            v.add(
                format!("{at}[{name}]"),
                format!("counter name `{name}` is not a DNS label"),
            );
        }
    }
}

fn check_devices(
    v: &mut Violations,
    slice: &ResourceSlice,
    devices: &[Device],
    sets: &[CounterSet],
    server: ServerVersion,
) {
    let advanced = devices.iter().any(uses_advanced_features);
    let limit = if advanced {
        MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    if devices.len() > limit {
        v.add(
            "spec.devices",
            format!(
                "{} devices, at most {limit} are allowed{}",
                devices.len(),
                if advanced {
                    " when a device has taints, consumes counters or has list attributes"
                } else {
                    ""
                }
            ),
        );
    }
    let per_device_nodes = slice.spec.per_device_node_selection == Some(true);
    let mut names = BTreeSet::new();
    let mut consumed_total = 0;
    for (i, device) in devices.iter().enumerate() {
        let at = format!("spec.devices[{i}]");
        if !is_dns_label(&device.name) {
            v.add(
                format!("{at}.name"),
                format!("`{}` is not a DNS label", device.name),
            );
        }
        if !names.insert(&device.name) {
            v.add(
                format!("{at}.name"),
                format!("device `{}` appears twice", device.name),
            );
        }
        check_device_fields(v, &at, device, per_device_nodes);
        check_taints(v, &at, device, server);
        consumed_total += check_consumption(v, &at, device, sets, server);
    }
    if !server.splits_counters_from_devices()
        && consumed_total > MAX_CONSUMED_COUNTERS_PER_SLICE_1_34
    {
        v.add(
            "spec.devices",
            format!(
                "devices consume {consumed_total} counters together, at most {MAX_CONSUMED_COUNTERS_PER_SLICE_1_34} are allowed per slice in 1.34"
            ),
        );
    }
}

fn uses_advanced_features(device: &Device) -> bool {
    let lists = device.attributes.iter().flatten().any(|(_, a)| {
        a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
    });
    lists
        || device.taints.as_ref().is_some_and(|t| !t.is_empty())
        || device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
}

fn check_device_fields(v: &mut Violations, at: &str, device: &Device, per_device_nodes: bool) {
    let attributes = device.attributes.as_ref();
    let capacities = device.capacity.as_ref();
    let entries = attributes.map_or(0, BTreeMap::len) + capacities.map_or(0, BTreeMap::len);
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE {
        v.add(
            at,
            format!(
                "{entries} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES_PER_DEVICE} are allowed"
            ),
        );
    }
    for (name, value) in attributes.into_iter().flatten() {
        // Field paths are formatted only for violations: this loop runs for every attribute.
        let field = || format!("{at}.attributes[{name}]");
        if let Err(e) = check_qualified_name(name) {
            v.add(field(), e);
        }
        if let Err(e) = check_attribute_value(value) {
            v.add(field(), e);
        }
    }
    for (name, capacity) in capacities.into_iter().flatten() {
        let field = || format!("{at}.capacity[{name}]");
        if let Err(e) = check_qualified_name(name) {
            v.add(field(), e);
        }
        if !is_quantity(&capacity.value.0) {
            v.add(
                format!("{}.value", field()),
                format!("`{}` is not a quantity", capacity.value.0),
            );
        }
        if let Some(policy) = &capacity.request_policy {
            let multi = device.allow_multiple_allocations == Some(true);
            if let Err(e) = check_request_policy(policy, &capacity.value.0, multi) {
                v.add(format!("{}.requestPolicy", field()), e);
            }
        }
    }
    let node_fields =
        device.node_name.is_some() || device.node_selector.is_some() || device.all_nodes.is_some();
    if node_fields && !per_device_nodes {
        v.add(
            at,
            "nodeName, nodeSelector and allNodes of a device need spec.perDeviceNodeSelection",
        );
    }
    for (field, conditions) in [
        ("bindingConditions", &device.binding_conditions),
        (
            "bindingFailureConditions",
            &device.binding_failure_conditions,
        ),
    ] {
        let count = conditions.as_ref().map_or(0, Vec::len);
        if count > MAX_BINDING_CONDITIONS {
            v.add(
                format!("{at}.{field}"),
                format!("{count} entries, at most {MAX_BINDING_CONDITIONS} are allowed"),
            );
        }
    }
}

/// A capacity's request policy as the API server validates it (for the integer quantities Tessera
/// publishes): only on multi-allocatable devices; `validRange` or `validValues`, not both, each
/// with a `default`; `min <= default <= max <= value`, `default` and `max` reachable from `min` in
/// whole steps, a step no larger than the capacity; valid values ascending, at most 10, listing
/// the default.
fn check_request_policy(
    policy: &CapacityRequestPolicy,
    value: &str,
    multi: bool,
) -> Result<(), String> {
    if !multi {
        return Err("a request policy needs allowMultipleAllocations: true".to_owned());
    }
    let number = |q: &Quantity| tessera_api::config::quantity_bytes(&q.0);
    let value = number(&Quantity(value.to_owned()))?;
    let default = policy.default.as_ref().map(number).transpose()?;
    match (&policy.valid_range, &policy.valid_values) {
        (Some(_), Some(_)) => Err("validRange and validValues are mutually exclusive".to_owned()),
        (None, None) => match default {
            Some(d) if d > value => Err(format!("default {d} exceeds the capacity {value}")),
            _ => Ok(()),
        },
        (Some(range), None) => {
            let default = default.ok_or("validRange needs a default")?;
            let min = number(&range.min)?;
            let max = range.max.as_ref().map(number).transpose()?.unwrap_or(value);
            if !(min <= default && default <= max && max <= value) {
                return Err(format!(
                    "needs min <= default <= max <= capacity, got {min}, {default}, {max}, {value}"
                ));
            }
            if let Some(step) = range.step.as_ref().map(number).transpose()? {
                if step == 0 {
                    return Err("validRange.step must be positive".to_owned());
                }
                if step > value {
                    return Err(format!(
                        "one step {step} is larger than the capacity {value}"
                    ));
                }
                if (default - min) % step != 0 || (max - min) % step != 0 {
                    return Err(format!(
                        "default {default} and max {max} must be min {min} plus whole steps of {step}"
                    ));
                }
            }
            Ok(())
        }
        (None, Some(values)) => {
            let values: Vec<u64> = values.iter().map(number).collect::<Result<_, _>>()?;
            if values.is_empty() || values.len() > 10 {
                return Err(format!(
                    "validValues has {} entries, 1 to 10 are allowed",
                    values.len()
                ));
            }
            if values.windows(2).any(|w| w[0] >= w[1]) || values.last() > Some(&value) {
                return Err("validValues must ascend and not exceed the capacity".to_owned());
            }
            match default {
                Some(d) if values.contains(&d) => Ok(()),
                _ => Err("validValues needs a default that it lists".to_owned()),
            }
        }
    }
}

/// Exactly one value; strings and versions within limits.
fn check_attribute_value(a: &DeviceAttribute) -> Result<(), String> {
    let set = [
        a.bool.is_some(),
        a.int.is_some(),
        a.string.is_some(),
        a.version.is_some(),
        a.bools.is_some(),
        a.ints.is_some(),
        a.strings.is_some(),
        a.versions.is_some(),
    ]
    .into_iter()
    .filter(|s| *s)
    .count();
    if set != 1 {
        return Err(format!(
            "an attribute has exactly one value, this one has {set}"
        ));
    }
    if let Some(s) = &a.string {
        check_string_value(s)?;
    }
    if let Some(s) = &a.version {
        check_version_value(s)?;
    }
    for s in a.strings.iter().flatten() {
        check_string_value(s)?;
    }
    for s in a.versions.iter().flatten() {
        check_version_value(s)?;
    }
    Ok(())
}

fn check_taints(v: &mut Violations, at: &str, device: &Device, server: ServerVersion) {
    let taints = device.taints.as_deref().unwrap_or_default();
    let max = server.max_taints_per_device();
    if taints.len() > max {
        v.add(
            format!("{at}.taints"),
            format!(
                "{} taints, at most {max} are allowed (server {server})",
                taints.len()
            ),
        );
    }
    for (j, taint) in taints.iter().enumerate() {
        let field = format!("{at}.taints[{j}]");
        if !is_label_key(&taint.key) {
            v.add(
                format!("{field}.key"),
                format!("`{}` is not a label key", taint.key),
            );
        }
        if let Some(value) = &taint.value
            && !is_label_value(value)
        {
            v.add(
                format!("{field}.value"),
                format!("`{value}` is not a label value"),
            );
        }
        if !server.taint_effects().contains(&taint.effect.as_str()) {
            v.add(
                format!("{field}.effect"),
                format!(
                    "`{}` is not one of {} (server {server})",
                    taint.effect,
                    server.taint_effects().join(", ")
                ),
            );
        }
    }
}

/// Checks a device's counter consumption; returns how many counters it consumes.
fn check_consumption(
    v: &mut Violations,
    at: &str,
    device: &Device,
    sets: &[CounterSet],
    server: ServerVersion,
) -> usize {
    let consumptions = device.consumes_counters.as_deref().unwrap_or_default();
    if server.splits_counters_from_devices()
        && consumptions.len() > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE
    {
        v.add(
            format!("{at}.consumesCounters"),
            format!(
                "{} entries, at most {MAX_COUNTER_CONSUMPTIONS_PER_DEVICE} are allowed",
                consumptions.len()
            ),
        );
    }
    let mut referenced = BTreeSet::new();
    let mut total = 0;
    for (j, consumption) in consumptions.iter().enumerate() {
        let field = format!("{at}.consumesCounters[{j}]");
        total += consumption.counters.len();
        if !is_dns_label(&consumption.counter_set) {
            v.add(
                format!("{field}.counterSet"),
                format!("`{}` is not a DNS label", consumption.counter_set),
            );
        }
        if !referenced.insert(&consumption.counter_set) {
            v.add(
                format!("{field}.counterSet"),
                format!(
                    "counter set `{}` is referenced twice",
                    consumption.counter_set
                ),
            );
        }
        check_counters(v, &format!("{field}.counters"), consumption.counters.keys());
        if server.splits_counters_from_devices() {
            continue;
        }
        // 1.34: the counter set must be defined in this very slice.
        match sets.iter().find(|s| s.name == consumption.counter_set) {
            None => v.add(
                format!("{field}.counterSet"),
                format!(
                    "counter set `{}` is not defined in this slice's sharedCounters, as 1.34 requires",
                    consumption.counter_set
                ),
            ),
            Some(set) => {
                for name in consumption.counters.keys() {
                    if !set.counters.contains_key(name) {
                        v.add(
                            format!("{field}.counters[{name}]"),
                            format!("counter set `{}` has no counter `{name}`", set.name),
                        );
                    }
                }
            }
        }
    }
    total
}

/// Label key: optional DNS-subdomain prefix (≤ 253) and `/`, then a name of at most 63
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric.
fn is_label_value(value: &str) -> bool {
    let b = value.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric())
}

/// A Kubernetes quantity: a signed decimal number with an optional binary (`Ki`…`Ei`) or decimal
/// (`n u m k M G T P E`) suffix or a decimal exponent (`1e3`).
fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let number_ok = !number.is_empty() && number != "." && number.matches('.').count() <= 1;
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()));
    number_ok && suffix_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for ok in [
            "0",
            "1",
            "85520809984",
            "1.5",
            "100Mi",
            "-1",
            "1e3",
            "500m",
            "+2Gi",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "Mi", "1.2.3", "1MiB", "one", ".", "1e"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn label_keys_and_values() {
        assert!(is_label_key("gpu.tessera.dev/topology-managed"));
        assert!(is_label_key("xid"));
        assert!(!is_label_key("Bad_Domain/x"));
        assert!(!is_label_key("gpu.tessera.dev/"));
        assert!(is_label_value(""));
        assert!(is_label_value("79"));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value(&"x".repeat(64)));
    }
}
