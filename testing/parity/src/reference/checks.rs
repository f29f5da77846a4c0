//! What the API documents about one device and one request, each check on its own: the class's
//! and the request's selectors (and, for per-device node selection, the device's node), capacity
//! (consumable capacity: requests rounded up by the device's policy, the sum of what is consumed
//! within the device's value), taints and tolerations, and attribute comparison for constraints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, Device, DeviceAttribute, DeviceCapacity,
};

use super::alternative::Alternative;
use super::pools::{Candidate, device_on_node};
use super::quantity::Nanos;
use super::selectors::{Eval, SelectorTable};
use super::stop::{Beyond, NodeStop, beyond, quantity};

/// The class's selectors, then the request's, then (per-device node selection) the device's
/// node: a selector that fails to compile or to evaluate stops allocation with an error.
pub fn selectable(
    table: &SelectorTable,
    alt: &Alternative<'_>,
    cand: &Candidate<'_>,
    node: &Node,
) -> Result<bool, NodeStop> {
    for expression in alt.class_selectors.iter().chain(&alt.request_selectors) {
        let eval = table
            .get(expression, cand.slice_index, cand.device_index)
            .ok_or_else(|| NodeStop::Beyond(beyond("a selector verdict missing from the table")))?;
        match eval {
            Eval::True => {}
            Eval::False => return Ok(false),
            Eval::CompileError => return Err(NodeStop::Error("cel-compile")),
            Eval::RuntimeError => return Err(NodeStop::Error("cel-runtime")),
        }
    }
    if cand.slice.spec.per_device_node_selection == Some(true) {
        return device_on_node(cand.device, node).map_err(NodeStop::Beyond);
    }
    Ok(true)
}

/// Whether what the request asks of each of the device's capacities fits: every capacity
/// requested exists on the device, what it consumes keeps to the capacity's request policy,
/// and `already` (shares in use) plus `pending` (shares of this allocation) plus it stays
/// within the capacity's value.
pub fn capacity_fits(
    alt: &Alternative<'_>,
    device: &Device,
    already: &dyn Fn(&str) -> Nanos,
    pending: &dyn Fn(&str) -> Nanos,
) -> Result<bool, NodeStop> {
    let capacities = device.capacity.clone().unwrap_or_default();
    if alt
        .capacity
        .keys()
        .any(|name| !capacities.contains_key(name))
    {
        return Ok(false);
    }
    let consumed = consumed_capacity(alt, device)?;
    for (name, capacity) in &capacities {
        let wanted = consumed[name];
        if violates(wanted, capacity.request_policy.as_ref())? {
            return Ok(false);
        }
        if already(name) + wanted + pending(name)
            > quantity(&capacity.value).map_err(NodeStop::Beyond)?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What an allocation of the device for the request consumes of each of its capacities: the
/// request rounded up by the policy (to the range's minimum and step, or to the next valid
/// value), or, without a request, the policy's default or else the whole capacity.
pub fn consumed_capacity(
    alt: &Alternative<'_>,
    device: &Device,
) -> Result<BTreeMap<String, Nanos>, NodeStop> {
    let mut out = BTreeMap::new();
    for (name, capacity) in device.capacity.iter().flatten() {
        let wanted = match alt.capacity.get(name) {
            Some(q) => Some(quantity(q).map_err(NodeStop::Beyond)?),
            None => None,
        };
        let value = consumption(wanted, capacity).map_err(NodeStop::Beyond)?;
        if value < Nanos::ZERO {
            return Err(NodeStop::Error("capacity"));
        }
        out.insert(name.clone(), value);
    }
    Ok(out)
}

fn consumption(wanted: Option<Nanos>, capacity: &DeviceCapacity) -> Result<Nanos, Beyond> {
    let policy = capacity.request_policy.as_ref();
    let Some(wanted) = wanted else {
        return match policy.and_then(|p| p.default.as_ref()) {
            Some(default) => quantity(default),
            None => quantity(&capacity.value),
        };
    };
    let Some(policy) = policy else {
        return Ok(wanted);
    };
    if let Some(range) = &policy.valid_range {
        let min = quantity(&range.min)?;
        if wanted < min {
            return Ok(min);
        }
        let Some(step) = &range.step else {
            return Ok(wanted);
        };
        // Whole units (upstream's range arithmetic without fractional ranges).
        let step = quantity(step)?.ceil_units();
        let (min, wanted) = (min.ceil_units(), wanted.ceil_units());
        if step <= 0 || min < 0 {
            return Err(beyond("a capacity range with a step that is not positive"));
        }
        let steps = (wanted - min + step - 1) / step;
        return Ok(Nanos::units(min + step * steps));
    }
    if let Some(values) = &policy.valid_values {
        for v in values {
            let v = quantity(v)?;
            if wanted <= v {
                return Ok(v);
            }
        }
    }
    Ok(wanted)
}

/// Whether a consumed amount breaks the capacity's request policy (the default never does).
fn violates(value: Nanos, policy: Option<&CapacityRequestPolicy>) -> Result<bool, NodeStop> {
    let Some(policy) = policy else {
        return Ok(false);
    };
    if let Some(default) = &policy.default
        && quantity(default).map_err(NodeStop::Beyond)? == value
    {
        return Ok(false);
    }
    policy_rejects(value, policy).map_err(NodeStop::Beyond)
}

/// The policy's range or valid values alone.
pub fn policy_rejects(value: Nanos, policy: &CapacityRequestPolicy) -> Result<bool, Beyond> {
    if let Some(range) = &policy.valid_range {
        if let Some(max) = &range.max
            && value > quantity(max)?
        {
            return Ok(true);
        }
        if let Some(step) = &range.step {
            let step = quantity(step)?.ceil_units();
            if step <= 0 {
                return Err(beyond("a capacity range with a step that is not positive"));
            }
            let from_min = value.ceil_units() - quantity(&range.min)?.ceil_units();
            return Ok(from_min % step != 0);
        }
        return Ok(false);
    }
    if let Some(values) = policy.valid_values.as_ref().filter(|v| !v.is_empty()) {
        for v in values {
            if quantity(v)? == value {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// Every `NoSchedule` or `NoExecute` taint of the device is tolerated by one of the request's
/// tolerations (`None` and unknown effects do not prevent allocation).
pub fn tolerated(alt: &Alternative<'_>, device: &Device) -> bool {
    device.taints.iter().flatten().all(|taint| {
        !matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            || alt.tolerations.iter().any(|t| {
                let effect = t.effect.as_deref().unwrap_or_default();
                let key = t.key.as_deref().unwrap_or_default();
                (effect.is_empty() || effect == taint.effect)
                    && (key.is_empty() || key == taint.key)
                    && match t.operator.as_deref().unwrap_or_default() {
                        "" | "Equal" => {
                            t.value.as_deref().unwrap_or_default()
                                == taint.value.as_deref().unwrap_or_default()
                        }
                        "Exists" => true,
                        _ => false,
                    }
            })
    })
}

/// A device's attribute by fully qualified name: the name as the device lists it, or, in the
/// driver's own domain, the short name.
pub fn attribute<'d>(device: &'d Device, driver: &str, name: &str) -> Option<&'d DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    if let Some(a) = attributes.get(name) {
        return Some(a);
    }
    let (domain, id) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    attributes.get(id)
}

/// Whether two attributes hold the same value, by the type of `new`; `None` when `new` holds no
/// single string, integer, boolean or version.
pub fn same_value(new: &DeviceAttribute, old: &DeviceAttribute) -> Option<bool> {
    if let Some(s) = &new.string {
        return Some(old.string.as_ref() == Some(s));
    }
    if let Some(i) = new.int {
        return Some(old.int == Some(i));
    }
    if let Some(b) = new.bool {
        return Some(old.bool == Some(b));
    }
    if let Some(v) = &new.version {
        return Some(old.version.as_ref() == Some(v));
    }
    None
}
