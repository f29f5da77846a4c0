//! The devices in use before the claims are allocated, as kube-scheduler gathers them from the
//! claims in use: a result with admin access uses nothing; a result with a share ID is one share
//! of the device (with the capacity it consumes, when recorded); any other result holds the
//! device whole.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::quantity::Nanos;
use super::stop::{Beyond, quantity};
use crate::instance::{DeviceRef, Instance};

/// A device by driver, pool and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl DeviceKey {
    pub fn new(driver: &str, pool: &str, device: &str) -> DeviceKey {
        DeviceKey {
            driver: driver.to_owned(),
            pool: pool.to_owned(),
            device: device.to_owned(),
        }
    }

    fn of(d: &DeviceRef) -> DeviceKey {
        DeviceKey::new(&d.driver, &d.pool, &d.device)
    }
}

/// What is in use.
#[derive(Debug, Default)]
pub struct State {
    /// Devices held whole.
    whole: HashSet<DeviceKey>,
    /// Devices with at least one share.
    shared: HashSet<DeviceKey>,
    /// Capacity consumed by shares, per device and capacity name.
    consumed: HashMap<DeviceKey, BTreeMap<String, Nanos>>,
}

impl State {
    /// The state of an instance: its claims in use, then its explicit state.
    pub fn of(instance: &Instance) -> Result<State, Beyond> {
        let mut state = State::default();
        for claim in &instance.allocated_claims {
            state.add_claim(claim)?;
        }
        if let Some(explicit) = &instance.state {
            for d in &explicit.devices {
                state.whole.insert(DeviceKey::of(d));
            }
            for s in &explicit.shared {
                state.shared.insert(DeviceKey::of(&s.device));
            }
            for c in &explicit.consumed {
                let entry = state.consumed.entry(DeviceKey::of(&c.device)).or_default();
                for (name, q) in &c.capacity {
                    let sum = entry.get(name).copied().unwrap_or_default() + quantity(q)?;
                    entry.insert(name.clone(), sum);
                }
            }
        }
        Ok(state)
    }

    fn add_claim(&mut self, claim: &ResourceClaim) -> Result<(), Beyond> {
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            if r.admin_access == Some(true) {
                continue;
            }
            let key = DeviceKey::new(&r.driver, &r.pool, &r.device);
            if r.share_id.is_none() {
                self.whole.insert(key);
                continue;
            }
            self.shared.insert(key.clone());
            if let Some(consumed) = &r.consumed_capacity {
                let entry = self.consumed.entry(key).or_default();
                for (name, q) in consumed {
                    let sum = entry.get(name).copied().unwrap_or_default() + quantity(q)?;
                    entry.insert(name.clone(), sum);
                }
            }
        }
        Ok(())
    }

    /// Held whole by a claim in use.
    pub fn is_held_whole(&self, key: &DeviceKey) -> bool {
        self.whole.contains(key)
    }

    /// In use in any way (whole, shared, or with consumed capacity recorded): what counts
    /// against a pool's counters.
    pub fn is_in_use(&self, key: &DeviceKey) -> bool {
        self.whole.contains(key) || self.has_shares(key)
    }

    /// Has shares (a share ID, or consumed capacity recorded).
    pub fn has_shares(&self, key: &DeviceKey) -> bool {
        self.shared.contains(key) || self.consumed.contains_key(key)
    }

    /// Capacity already consumed on a device by shares.
    pub fn consumed(&self, key: &DeviceKey, capacity: &str) -> Option<Nanos> {
        self.consumed.get(key)?.get(capacity).copied()
    }
}
