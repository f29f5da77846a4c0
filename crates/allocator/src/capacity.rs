//! Consumable capacity: what a request consumes of a device's capacities under the device's
//! request policies, and whether it still fits next to what is already consumed.
//!
//! For every capacity the device publishes: no request → the policy's `default`, else the whole
//! value; a request with no policy → the request itself; with `validRange` → at least `min`,
//! rounded up to `min + k·step`; with `validValues` → the smallest valid value ≥ the request. The
//! result must satisfy the policy (`max`, step multiple, listed value — the default always does)
//! and, added to what allocated and in-flight allocations consume, must not exceed the value.
//! A request naming a capacity the device does not publish does not fit that device.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::device::{Capacity, RequestPolicy};
use crate::quantity::Amount;

/// Why a request's capacity does not fit a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CapacityRefusal {
    /// The request names a capacity the device does not publish.
    Unknown { capacity: String },
    /// The (rounded) amount breaks the device's request policy.
    Policy { capacity: String, amount: Amount },
    /// Not enough left.
    Exhausted {
        capacity: String,
        wanted: Amount,
        available: Amount,
    },
}

impl fmt::Display for CapacityRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapacityRefusal::Unknown { capacity } => {
                write!(
                    f,
                    "the request asks for capacity {capacity}, which the device does not publish"
                )
            }
            CapacityRefusal::Policy { capacity, amount } => {
                write!(
                    f,
                    "capacity {capacity}: {amount} is not allowed by the device's request policy"
                )
            }
            CapacityRefusal::Exhausted {
                capacity,
                wanted,
                available,
            } => write!(f, "capacity {capacity}: {wanted} wanted, {available} left"),
        }
    }
}

/// What one allocation consumes of each capacity of a device, with the text to publish.
pub(crate) type Consumption = Vec<(String, Amount, Quantity)>;

/// What `requests` consume of `capacities` if the policies allow it, and whether it fits next to
/// `used` (capacity name → amount already consumed by allocated and in-flight allocations).
pub(crate) fn consume(
    capacities: &[Capacity],
    requests: &[(String, Amount, Quantity)],
    used: &dyn Fn(&str) -> Amount,
) -> Result<Consumption, CapacityRefusal> {
    if let Some((name, ..)) = requests
        .iter()
        .find(|(n, ..)| !capacities.iter().any(|c| c.name == *n))
    {
        return Err(CapacityRefusal::Unknown {
            capacity: name.clone(),
        });
    }
    let mut out = Vec::with_capacity(capacities.len());
    for cap in capacities {
        let requested = requests
            .iter()
            .find(|(n, ..)| *n == cap.name)
            .map(|(_, a, q)| (*a, q));
        let (amount, text) = consumed_by(requested, cap);
        if let Some(policy) = &cap.policy
            && violates(amount, policy)
        {
            return Err(CapacityRefusal::Policy {
                capacity: cap.name.clone(),
                amount,
            });
        }
        let already = used(&cap.name);
        if already.saturating_add(amount) > cap.value {
            return Err(CapacityRefusal::Exhausted {
                capacity: cap.name.clone(),
                wanted: amount,
                available: cap.value.saturating_sub(already),
            });
        }
        out.push((cap.name.clone(), amount, text));
    }
    Ok(out)
}

fn consumed_by(requested: Option<(Amount, &Quantity)>, cap: &Capacity) -> (Amount, Quantity) {
    let Some((value, text)) = requested else {
        return match cap.policy.as_ref().and_then(|p| p.default.as_ref()) {
            Some((a, q)) => (*a, q.clone()),
            None => (cap.value, cap.raw.clone()),
        };
    };
    let Some(policy) = &cap.policy else {
        return (value, text.clone());
    };
    if let Some(range) = &policy.range {
        let (min, min_text) = &range.min;
        if value < *min {
            return (*min, min_text.clone());
        }
        return match range.step {
            Some(step) if step > Amount::ZERO => {
                let above = value.saturating_sub(*min);
                let rounded = round_up_to_step(above, step);
                if rounded == above {
                    (value, text.clone())
                } else {
                    let v = min.saturating_add(rounded);
                    (v, v.to_quantity())
                }
            }
            _ => (value, text.clone()),
        };
    }
    if let Some((v, q)) = policy.valid_values.iter().find(|(v, _)| value <= *v) {
        return (*v, q.clone());
    }
    (value, text.clone())
}

fn round_up_to_step(above_min: Amount, step: Amount) -> Amount {
    let (a, s) = (above_min.nanos(), step.nanos());
    let k = a.div_euclid(s) + i128::from(a.rem_euclid(s) != 0);
    Amount::from_nanos(k.saturating_mul(s))
}

fn violates(amount: Amount, policy: &RequestPolicy) -> bool {
    if policy.default.as_ref().is_some_and(|(d, _)| *d == amount) {
        return false;
    }
    if let Some(range) = &policy.range {
        if range.max.is_some_and(|max| amount > max) {
            return true;
        }
        if let Some(step) = range.step.filter(|s| *s > Amount::ZERO) {
            let above = amount.saturating_sub(range.min.0);
            return round_up_to_step(above, step) != above;
        }
        return false;
    }
    !policy.valid_values.is_empty() && !policy.valid_values.iter().any(|(v, _)| *v == amount)
}

/// Sums consumption per capacity name.
pub(crate) fn add_into(total: &mut BTreeMap<String, Amount>, consumption: &Consumption) {
    for (name, amount, _) in consumption {
        let slot = total.entry(name.clone()).or_default();
        *slot = slot.saturating_add(*amount);
    }
}

/// Subtracts consumption per capacity name.
pub(crate) fn sub_from(total: &mut BTreeMap<String, Amount>, consumption: &Consumption) {
    for (name, amount, _) in consumption {
        if let Some(slot) = total.get_mut(name) {
            *slot = slot.saturating_sub(*amount);
        }
    }
}
