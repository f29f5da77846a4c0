//! IMEX domains as the placement sees them (docs/user-guide.md, "Jobs across NVLink racks
//! (IMEX)"). A claim with a request of class `imex.gpu.tessera.dev` is a domain: its one device is
//! a channel of a fabric clique's pool `imex-<clique>`, which the controller publishes
//! network-attached to the clique's nodes, so once the claim is allocated every pod sharing it can
//! only run in that clique. What a group decision needs of that, as functions of data: which claims
//! are domains, the clique of a domain's channel, and each clique's channels and how many of them
//! are in use.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::imex::{IMEX_DEVICE_CLASS, clique_of_pool};
use tessera_api::names::DRIVER_NAME;

use crate::claims::allocation;
use crate::pods::usage_node;
use crate::protocol::object_key;
use crate::resolve::PodClaim;

/// Whether `claim` asks for an IMEX channel (a request or subrequest of class
/// `imex.gpu.tessera.dev`): the claim is an IMEX domain.
pub fn is_domain_claim(claim: &ResourceClaim) -> bool {
    // Read in place: every group decision asks this of every member's claims.
    let requests = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref());
    requests.into_iter().flatten().any(|r| {
        r.exactly
            .as_ref()
            .is_some_and(|e| e.device_class_name == IMEX_DEVICE_CLASS)
            || r.first_available
                .iter()
                .flatten()
                .any(|s| s.device_class_name == IMEX_DEVICE_CLASS)
    })
}

/// The clique of the channel `claim` was allocated, if it has one.
pub fn channel_clique(claim: &ResourceClaim) -> Option<String> {
    allocation(claim)?
        .devices
        .as_ref()?
        .results
        .iter()
        .flatten()
        .filter(|r| r.driver == DRIVER_NAME)
        .find_map(|r| clique_of_pool(&r.pool).map(str::to_owned))
}

/// The IMEX domain a group of pods asks for: the first domain claim its members name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainJob {
    /// The domain claim, `namespace/name`.
    pub claim: String,
    /// The clique of its channel, when the claim is allocated already: the job's pods can run
    /// nowhere else.
    pub clique: Option<String>,
}

impl DomainJob {
    /// The domain `claims` (the members' resolved claims, member by member) ask for, if any.
    pub fn of<'c>(claims: impl IntoIterator<Item = &'c [PodClaim]>) -> Option<DomainJob> {
        claims
            .into_iter()
            .flatten()
            .find(|c| is_domain_claim(&c.claim))
            .map(|c| DomainJob {
                claim: object_key(&c.claim.metadata),
                clique: channel_clique(&c.claim),
            })
    }
}

/// One clique's channels: how many the controller publishes and how many are allocated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Channels {
    pub total: usize,
    pub in_use: usize,
}

impl Channels {
    pub fn free(&self) -> usize {
        self.total.saturating_sub(self.in_use)
    }
}

/// The channels of every clique among the devices of `index` (those of the class
/// `imex.gpu.tessera.dev`; none when the class does not exist), counted against `in_use`.
pub fn channels(index: &DeviceIndex, in_use: &AllocatedState) -> BTreeMap<String, Channels> {
    let mut by_clique: BTreeMap<String, Channels> = BTreeMap::new();
    let Some(Ok(ids)) = index.devices_of_class(IMEX_DEVICE_CLASS) else {
        return by_clique;
    };
    for id in ids {
        let Some(clique) = clique_of_pool(id.pool()) else {
            continue;
        };
        let entry = by_clique.entry(clique.to_owned()).or_default();
        entry.total += 1;
        if in_use.is_in_use(id) {
            entry.in_use += 1;
        }
    }
    by_clique
}

/// The domains (`namespace/name`, sorted) among `claims` holding a channel of `clique`.
pub fn holders<'c>(
    claims: impl IntoIterator<Item = &'c ResourceClaim>,
    clique: &str,
) -> Vec<String> {
    let mut names: Vec<String> = claims
        .into_iter()
        .filter(|c| channel_clique(c).as_deref() == Some(clique))
        .map(|c| object_key(&c.metadata))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The IMEX domains whose pods run (bound) or are placed (released to a node) on each node:
/// node name → domains (`namespace/name`). The node driver runs one IMEX daemon per node, so a
/// node hosts the pods of one live domain at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainNodes {
    by_node: HashMap<String, BTreeSet<String>>,
}

impl DomainNodes {
    /// The domains of `pods` on their nodes: each pod with a node ([`usage_node`]) and an
    /// allocated domain claim, looked up by `claim(namespace, name)`.
    pub fn of<'p>(
        pods: impl IntoIterator<Item = &'p Pod>,
        claim: impl Fn(&str, &str) -> Option<Arc<ResourceClaim>>,
    ) -> DomainNodes {
        let mut found = DomainNodes::default();
        for pod in pods {
            let Some(node) = usage_node(pod) else {
                continue;
            };
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            for name in claim_names(pod) {
                let Some(c) = claim(namespace, name) else {
                    continue;
                };
                if is_domain_claim(&c) && allocation(&c).is_some() {
                    let domains = found.by_node.entry(node.clone()).or_default();
                    domains.insert(object_key(&c.metadata));
                }
            }
        }
        found
    }

    /// Whether no node hosts a domain's pod.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// A domain other than `domain` whose pods run on `node`, if any (the first by name).
    pub fn other_than(&self, node: &str, domain: &str) -> Option<&str> {
        self.by_node
            .get(node)?
            .iter()
            .find(|d| *d != domain)
            .map(String::as_str)
    }
}

/// The names of the claims `pod` uses: named in its spec, or generated from a template (the
/// pod's status).
fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
    let named = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    let generated = pod
        .status
        .iter()
        .flat_map(|s| s.resource_claim_statuses.iter().flatten())
        .filter_map(|c| c.resource_claim_name.as_deref());
    named.chain(generated)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };

    use super::*;
    use crate::synthetic::device_claim;

    fn domain(name: &str, pool: Option<&str>) -> ResourceClaim {
        let mut claim = device_claim("ml", name, name, IMEX_DEVICE_CLASS, 1);
        claim.status = pool.map(|pool| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "gpus".into(),
                        driver: DRIVER_NAME.into(),
                        pool: pool.into(),
                        device: "channel-3".into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        claim
    }

    #[test]
    fn a_domain_is_a_claim_of_the_channel_class_and_its_channel_names_the_clique() {
        let gpus = device_claim("ml", "gpus", "g", "gpu.tessera.dev", 4);
        assert!(!is_domain_claim(&gpus));
        let free = domain("free", None);
        let held = domain("held", Some("imex-u.7"));
        assert!(is_domain_claim(&free));
        assert_eq!(channel_clique(&free), None);
        assert_eq!(channel_clique(&held).as_deref(), Some("u.7"));
        assert_eq!(channel_clique(&domain("odd", Some("tray-1"))), None);
        assert_eq!(
            holders([&held, &free, &domain("other", Some("imex-u.8"))], "u.7"),
            ["ml/held"]
        );
        let member = |c: &ResourceClaim| {
            vec![PodClaim {
                pod_claim: "c".into(),
                claim: Arc::new(c.clone()),
            }]
        };
        let (a, b) = (member(&gpus), member(&held));
        assert_eq!(
            DomainJob::of([a.as_slice(), b.as_slice()]),
            Some(DomainJob {
                claim: "ml/held".into(),
                clique: Some("u.7".into())
            })
        );
        assert_eq!(DomainJob::of([a.as_slice()]), None);
    }
}
