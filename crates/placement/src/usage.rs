//! What the cluster uses — devices (every allocated claim) and cpu, memory and pod slots per node
//! (every pod counting on a node) — kept current object by object, so that a decision reads it
//! instead of rebuilding it from every claim and every pod. [`crate::pods::devices_in_use`] and
//! [`crate::pods::node_usage`] stay the definition: after any sequence of changes, [`ClusterUse`]
//! holds what they build from the objects as they are then (`crates/controller`'s tests check
//! that over seeded random sequences of watch events and the controller's own writes).
//!
//! Each object's contribution is kept under its key (`namespace/name`). A change recomputes the
//! entries of the devices and nodes that the object's old and new versions touch, from the objects
//! that touch them now, so the result does not depend on the order in which changes arrive. The
//! state a decision reads is handed out as an [`Arc`]: a decision keeps its snapshot while the
//! watches go on changing the state (copied on write only while a snapshot is held).
//!
//! Hand-written: the bookkeeping is specific to these two sums; no crate does it.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_allocator::{AllocatedState, DeviceId, SharedUse};

use crate::claims::allocation;
use crate::pods::{UnreadableAllocation, devices_in_use, pod_usage_requests, usage_node};
use crate::protocol::object_key;
use crate::resources::{NodeUsage, Requests};

/// One device's use by one claim: exclusively, and shared (share ids and what they consume).
#[derive(Clone, Debug, PartialEq)]
struct DeviceUse {
    id: DeviceId,
    dedicated: bool,
    shared: Option<SharedUse>,
}

/// What one claim's allocation uses, counted exactly as [`devices_in_use`] counts it (it is
/// what [`devices_in_use`] builds from this claim alone), and why its allocation does not parse.
fn claim_uses(claim: &ResourceClaim) -> (Vec<DeviceUse>, Option<UnreadableAllocation>) {
    let Some(allocation) = allocation(claim) else {
        return (Vec::new(), None);
    };
    let (state, mut unreadable) = devices_in_use(std::iter::once(claim));
    let mut uses: Vec<DeviceUse> = Vec::new();
    for r in allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
    {
        let id = DeviceId::new(&r.driver, &r.pool, &r.device);
        if uses.iter().any(|u| u.id == id) {
            continue;
        }
        let dedicated = state.is_dedicated(&id);
        let shared = state.shared(&id).cloned();
        if dedicated || shared.is_some() {
            uses.push(DeviceUse {
                id,
                dedicated,
                shared,
            });
        }
    }
    (uses, unreadable.pop())
}

/// What one pod adds to its node.
#[derive(Clone, Debug, PartialEq)]
struct PodUse {
    uid: Option<String>,
    node: String,
    requests: Requests,
}

/// Devices in use and node usage, kept current from changes to single claims and pods.
#[derive(Debug, Default)]
pub struct ClusterUse {
    /// Per allocated claim (by key), the devices it uses.
    claims: HashMap<String, Vec<DeviceUse>>,
    /// Per device in use, the keys of the claims using it.
    users: HashMap<DeviceId, Vec<String>>,
    in_use: Arc<AllocatedState>,
    /// Per pod counting on a node (by key), what it adds there.
    pods: HashMap<String, PodUse>,
    /// Per node, the keys of the pods counting on it.
    on_node: HashMap<String, Vec<String>>,
    /// Pod keys by UID (pods counting on a node only).
    uids: HashMap<String, String>,
    usage: Arc<HashMap<String, NodeUsage>>,
}

impl ClusterUse {
    /// Nothing in use.
    pub fn new() -> ClusterUse {
        ClusterUse::default()
    }

    /// Every device allocated by any claim ([`devices_in_use`]).
    pub fn devices_in_use(&self) -> Arc<AllocatedState> {
        self.in_use.clone()
    }

    /// What the pods on each node request ([`crate::pods::node_usage`] with no pod left out).
    pub fn node_usage(&self) -> Arc<HashMap<String, NodeUsage>> {
        self.usage.clone()
    }

    /// What the pods on each node request, except the pod with UID `except`
    /// ([`crate::pods::node_usage`]; UIDs are unique, as the API server makes them).
    pub fn node_usage_except(&self, except: &str) -> Arc<HashMap<String, NodeUsage>> {
        let Some(key) = self.uids.get(except) else {
            return self.usage.clone();
        };
        let Some(own) = self.pods.get(key) else {
            return self.usage.clone();
        };
        let mut usage = (*self.usage).clone();
        match self.node_sum(&own.node, Some(key.as_str())) {
            Some(sum) => usage.insert(own.node.clone(), sum),
            None => usage.remove(&own.node),
        };
        Arc::new(usage)
    }

    /// Replaces every claim's contribution with the ones of `claims` (after a relist); returns
    /// the claims whose allocation does not parse.
    pub fn rebuild_claims<'c>(
        &mut self,
        claims: impl IntoIterator<Item = &'c ResourceClaim>,
    ) -> Vec<UnreadableAllocation> {
        self.claims.clear();
        self.users.clear();
        self.in_use = Arc::new(AllocatedState::new());
        claims
            .into_iter()
            .filter_map(|c| self.set_claim(&object_key(&c.metadata), Some(c)))
            .collect()
    }

    /// The claim with key `key` is now `claim` (`None`: gone). Returns the claim's unreadable
    /// allocation, if it has one (its devices count as exclusively in use).
    pub fn set_claim(
        &mut self,
        key: &str,
        claim: Option<&ResourceClaim>,
    ) -> Option<UnreadableAllocation> {
        let (uses, unreadable) = claim.map(claim_uses).unwrap_or_default();
        if self
            .claims
            .get(key)
            .map_or(uses.is_empty(), |old| *old == uses)
        {
            return unreadable;
        }
        let old = if uses.is_empty() {
            self.claims.remove(key)
        } else {
            self.claims.insert(key.to_owned(), uses)
        };
        let mut touched: Vec<DeviceId> = Vec::new();
        for u in old.iter().flatten() {
            if let Some(users) = self.users.get_mut(&u.id) {
                users.retain(|k| k != key);
            }
            touched.push(u.id.clone());
        }
        let added: Vec<DeviceId> = self
            .claims
            .get(key)
            .into_iter()
            .flatten()
            .map(|u| u.id.clone())
            .collect();
        for id in added {
            self.users
                .entry(id.clone())
                .or_default()
                .push(key.to_owned());
            touched.push(id);
        }
        for (i, id) in touched.iter().enumerate() {
            if !touched[..i].contains(id) {
                self.recompute_device(id);
            }
        }
        unreadable
    }

    /// Sets the device's entry from the claims using it now.
    fn recompute_device(&mut self, id: &DeviceId) {
        let mut dedicated = false;
        let mut shared: Option<SharedUse> = None;
        let users = self.users.get(id).map(Vec::as_slice).unwrap_or_default();
        for key in users {
            for u in self.claims.get(key).into_iter().flatten() {
                if u.id != *id {
                    continue;
                }
                dedicated |= u.dedicated;
                if let Some(s) = &u.shared {
                    let entry = shared.get_or_insert_with(SharedUse::default);
                    entry.share_ids.extend(s.share_ids.iter().cloned());
                    for (name, amount) in &s.consumed {
                        let slot = entry.consumed.entry(name.clone()).or_default();
                        *slot = slot.saturating_add(*amount);
                    }
                }
            }
        }
        if users.is_empty() {
            self.users.remove(id);
        }
        Arc::make_mut(&mut self.in_use).set_device(id.clone(), dedicated, shared);
    }

    /// Replaces every pod's contribution with the ones of `pods` (after a relist).
    pub fn rebuild_pods<'p>(&mut self, pods: impl IntoIterator<Item = &'p Pod>) {
        self.pods.clear();
        self.on_node.clear();
        self.uids.clear();
        self.usage = Arc::new(HashMap::new());
        for pod in pods {
            self.set_pod(&object_key(&pod.metadata), Some(pod));
        }
    }

    /// The pod with key `key` is now `pod` (`None`: gone).
    pub fn set_pod(&mut self, key: &str, pod: Option<&Pod>) {
        let new = pod.and_then(|p| {
            usage_node(p).map(|node| PodUse {
                uid: p.metadata.uid.clone(),
                node,
                requests: pod_usage_requests(p),
            })
        });
        if self.pods.get(key) == new.as_ref() {
            return;
        }
        let old = match new {
            Some(new) => self.pods.insert(key.to_owned(), new),
            None => self.pods.remove(key),
        };
        if let Some(old) = &old {
            if let Some(keys) = self.on_node.get_mut(&old.node) {
                keys.retain(|k| k != key);
            }
            if let Some(uid) = &old.uid
                && self.uids.get(uid).is_some_and(|k| k == key)
            {
                self.uids.remove(uid);
            }
        }
        let new = self.pods.get(key).map(|p| (p.node.clone(), p.uid.clone()));
        if let Some((node, uid)) = &new {
            self.on_node
                .entry(node.clone())
                .or_default()
                .push(key.to_owned());
            if let Some(uid) = uid {
                self.uids.insert(uid.clone(), key.to_owned());
            }
        }
        if let Some(old) = old {
            self.recompute_node(&old.node);
        }
        if let Some((node, _)) = new {
            self.recompute_node(&node);
        }
    }

    /// What the pods counting on `node` request, `except` left out; `None` when no pod counts.
    fn node_sum(&self, node: &str, except: Option<&str>) -> Option<NodeUsage> {
        let mut sum: Option<NodeUsage> = None;
        for key in self.on_node.get(node).into_iter().flatten() {
            if Some(key.as_str()) == except {
                continue;
            }
            if let Some(pod) = self.pods.get(key) {
                sum.get_or_insert_with(NodeUsage::default)
                    .add_pod(pod.requests);
            }
        }
        sum
    }

    /// Sets the node's usage from the pods counting on it now.
    fn recompute_node(&mut self, node: &str) {
        let sum = self.node_sum(node, None);
        if self.on_node.get(node).is_some_and(Vec::is_empty) {
            self.on_node.remove(node);
        }
        let usage = Arc::make_mut(&mut self.usage);
        match sum {
            Some(sum) => usage.insert(node.to_owned(), sum),
            None => usage.remove(node),
        };
    }
}
