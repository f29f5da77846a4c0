//! Consumable capacity: what a request consumes of a device's capacities under the device's
//! request policies, and whether it still fits next to what is already consumed.
//!
//! For every capacity the device publishes: no request → the policy's `default`, else the whole
//! value; a request with no policy → the request itself; with `validRange` → at least `min`,
//! rounded up to `min + k·step`; with `validValues` → the smallest valid value ≥ the request. The
//! result must satisfy the policy (`max`, step multiple, listed value — the default always does)
//! and, added to what allocated and in-flight allocations consume, must not exceed the value.
//! A request naming a capacity the device does not publish does not fit that device.
//!
//! Step arithmetic is upstream's with `DRAFractionalCapacityRange` off (its default in 1.37):
//! request, `min` and `step` are rounded up to whole units first (`Quantity.Value()`), so a
//! fractional step counts as 1. A request above 2^63-1 units on that path, a rounded value past
//! it, or a negative consumption is not a device that does not fit but an error
//! ([`CapacityRefusal::Fatal`]), as upstream aborts the allocation on it.

use std::borrow::Cow;
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
    /// The request cannot be represented in the device's range arithmetic, or the consumption
    /// would be negative: the allocation fails (upstream aborts rather than trying other
    /// devices).
    Fatal { capacity: String, why: &'static str },
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
            CapacityRefusal::Fatal { capacity, why } => write!(f, "capacity {capacity}: {why}"),
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
    let mut out = Vec::with_capacity(capacities.len());
    consume_with(capacities, requests, used, |cap, amount, text| {
        out.push((cap.name.clone(), amount, text.into_owned()));
    })?;
    Ok(out)
}

/// Whether `requests` fit: [`consume`]'s answer without building the consumption (the search
/// asks this of every candidate; only a shared device's allocation needs the consumption).
pub(crate) fn fits(
    capacities: &[Capacity],
    requests: &[(String, Amount, Quantity)],
    used: &dyn Fn(&str) -> Amount,
) -> Result<(), CapacityRefusal> {
    consume_with(capacities, requests, used, |_, _, _| {})
}

/// [`consume`], handing each capacity's consumption to `emit` in the device's order.
fn consume_with<'c>(
    capacities: &'c [Capacity],
    requests: &'c [(String, Amount, Quantity)],
    used: &dyn Fn(&str) -> Amount,
    mut emit: impl FnMut(&'c Capacity, Amount, Cow<'c, Quantity>),
) -> Result<(), CapacityRefusal> {
    if let Some((name, ..)) = requests
        .iter()
        .find(|(n, ..)| !capacities.iter().any(|c| c.name == *n))
    {
        return Err(CapacityRefusal::Unknown {
            capacity: name.clone(),
        });
    }
    let consumed = |cap: &'c Capacity| {
        let requested = requests
            .iter()
            .find(|(n, ..)| *n == cap.name)
            .map(|(_, a, q)| (*a, q));
        let (amount, text) = consumed_by(requested, cap).map_err(|why| CapacityRefusal::Fatal {
            capacity: cap.name.clone(),
            why,
        })?;
        if amount < Amount::ZERO {
            return Err(CapacityRefusal::Fatal {
                capacity: cap.name.clone(),
                why: "capacity value is negative",
            });
        }
        Ok((amount, text))
    };
    // First every consumption (an unrepresentable one is fatal whatever the order), then the
    // soft checks, as upstream orders them.
    for cap in capacities {
        consumed(cap)?;
    }
    for cap in capacities {
        let (amount, text) = consumed(cap)?;
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
        emit(cap, amount, text);
    }
    Ok(())
}

/// What a request (or its absence) consumes of one capacity; `Err` when it cannot be represented.
fn consumed_by<'c>(
    requested: Option<(Amount, &'c Quantity)>,
    cap: &'c Capacity,
) -> Result<(Amount, Cow<'c, Quantity>), &'static str> {
    let Some((value, text)) = requested else {
        return Ok(match cap.policy.as_ref().and_then(|p| p.default.as_ref()) {
            Some((a, q)) => (*a, Cow::Borrowed(q)),
            None => (cap.value, Cow::Borrowed(&cap.raw)),
        });
    };
    let Some(policy) = &cap.policy else {
        return Ok((value, Cow::Borrowed(text)));
    };
    if let Some(range) = &policy.range {
        let (min, min_text) = &range.min;
        if value < *min {
            return Ok((*min, Cow::Borrowed(min_text)));
        }
        let Some(step) = range.step else {
            return Ok((value, Cow::Borrowed(text)));
        };
        // Upstream's integer path: whole units, rounded up.
        if value.ceil_units() > i128::from(i64::MAX) {
            return Err(
                "capacity request cannot be represented in the device's range arithmetic (above 2^63-1)",
            );
        }
        let (request, min, step) = (value.ceil_units(), min.ceil_units(), step.ceil_units());
        if step <= 0 {
            return Ok((value, Cow::Borrowed(text)));
        }
        let added = request - min;
        let n = added / step + i128::from(added % step != 0);
        if min >= 0 && n > (i128::from(i64::MAX) - min) / step {
            return Err(
                "capacity request cannot be represented in the device's range arithmetic (rounding passes 2^63-1)",
            );
        }
        let units = i64::try_from(min + step * n).unwrap_or(i64::MAX);
        let v = Amount::from_units(units);
        return Ok((v, Cow::Owned(v.to_quantity())));
    }
    if let Some((v, q)) = policy.valid_values.iter().find(|(v, _)| value <= *v) {
        return Ok((*v, Cow::Borrowed(q)));
    }
    Ok((value, Cow::Borrowed(text)))
}

fn violates(amount: Amount, policy: &RequestPolicy) -> bool {
    if policy.default.as_ref().is_some_and(|(d, _)| *d == amount) {
        return false;
    }
    if let Some(range) = &policy.range {
        if range.max.is_some_and(|max| amount > max) {
            return true;
        }
        if let Some(step) = range.step {
            // Upstream's integer path: `(requested - min) % step` in whole units.
            let step = step.ceil_units();
            return step != 0 && (amount.ceil_units() - range.min.0.ceil_units()) % step != 0;
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
