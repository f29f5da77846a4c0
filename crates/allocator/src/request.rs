//! The claims to allocate, validated and flattened: every request or subrequest becomes a
//! [`Slot`] with its class, compiled selectors, count, tolerations and capacity requests.

use std::fmt;

use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceConstraint, DeviceRequest, DeviceSelector, DeviceToleration,
    ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::error::AllocateError;
use crate::quantity::Amount;
use crate::selection::{Compiled, EmptySelector};

/// Most results one allocation may hold (`AllocationResultsMaxSize`).
pub const MAX_RESULTS_PER_CLAIM: usize = 32;

/// How many devices a slot asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    Count(usize),
    All,
}

/// One request, or one subrequest of a `firstAvailable` request.
#[derive(Debug)]
pub(crate) struct Slot {
    pub claim: usize,
    /// `req` or `req/sub`.
    pub full_name: String,
    /// The top-level request's name.
    pub request_name: String,
    pub class: String,
    /// Compiled request selectors (a selector that does not compile fails when evaluated).
    pub selectors: Vec<Compiled>,
    pub wanted: Wanted,
    pub admin_access: bool,
    pub tolerations: Vec<DeviceToleration>,
    pub capacity: Vec<(String, Amount, Quantity)>,
}

/// A claim's constraint, ready to check.
#[derive(Debug, Clone)]
pub(crate) struct ConstraintSpec {
    pub kind: ConstraintKind,
    pub attribute: String,
    /// Request names it applies to (`req` or `req/sub`); empty means all.
    pub requests: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConstraintKind {
    Match,
    Distinct,
}

impl ConstraintSpec {
    pub fn applies_to(&self, slot: &Slot) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| *r == slot.request_name || *r == slot.full_name)
    }
}

/// One top-level request: its alternatives (one slot, or one per subrequest, in order).
#[derive(Debug)]
pub(crate) struct RequestPlan {
    pub name: String,
    pub slots: Vec<usize>,
    pub first_available: bool,
}

/// One claim to allocate.
#[derive(Debug)]
pub(crate) struct ClaimPlan<'c> {
    pub claim: &'c ResourceClaim,
    /// `namespace/name` (or just the name).
    pub name: String,
    pub requests: Vec<RequestPlan>,
    pub constraints: Vec<ConstraintSpec>,
}

/// All claims of one allocation, with their slots.
#[derive(Debug)]
pub(crate) struct Plan<'c> {
    pub claims: Vec<ClaimPlan<'c>>,
    pub slots: Vec<Slot>,
}

impl Plan<'_> {
    /// A lower bound of the devices the claims need on any node (`All` counts as one).
    pub fn min_devices(&self) -> usize {
        self.claims
            .iter()
            .flat_map(|c| &c.requests)
            .map(|r| {
                r.slots
                    .iter()
                    .map(|&s| match self.slots[s].wanted {
                        Wanted::Count(n) => n,
                        Wanted::All => 1,
                    })
                    .min()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Some request has admin access (may use devices that are in use).
    pub fn has_admin_access(&self) -> bool {
        self.slots.iter().any(|s| s.admin_access)
    }

    /// Some request lists alternatives (`firstAvailable`).
    pub fn has_first_available(&self) -> bool {
        self.claims
            .iter()
            .flat_map(|c| &c.requests)
            .any(|r| r.first_available)
    }
}

/// `namespace/name` of a claim.
pub fn claim_name(claim: &ResourceClaim) -> String {
    match (&claim.metadata.namespace, &claim.metadata.name) {
        (Some(ns), Some(name)) if !ns.is_empty() => format!("{ns}/{name}"),
        (_, name) => name.clone().unwrap_or_default(),
    }
}

/// What makes claims unschedulable on every node, before any device is looked at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ClaimProblem {
    /// A request names a DeviceClass that does not exist (yet).
    MissingClass {
        claim: String,
        request: String,
        class: String,
    },
    /// A request has neither `exactly` nor `firstAvailable` (a request type this version does
    /// not know).
    UnknownRequestType { claim: String, request: String },
}

impl fmt::Display for ClaimProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimProblem::MissingClass {
                claim,
                request,
                class,
            } => write!(
                f,
                "claim {claim}, request {request}: DeviceClass {class} does not exist; create it or fix deviceClassName (the claims wait until it exists)"
            ),
            ClaimProblem::UnknownRequestType { claim, request } => write!(
                f,
                "claim {claim}, request {request}: unknown request type (neither exactly nor firstAvailable)"
            ),
        }
    }
}

/// What kube-scheduler's PreFilter checks before any node: every request of every claim names a
/// DeviceClass that exists and is of a known type. A missing class or an unknown request type
/// makes the pod unschedulable (`Ok(Some(problem))`); an empty class name is an error.
pub(crate) fn prefilter(
    inv: &Cluster,
    claims: &[ResourceClaim],
) -> Result<Option<ClaimProblem>, AllocateError> {
    for claim in claims {
        let name = claim_name(claim);
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default();
        for request in requests {
            let classes: Vec<(String, &str)> = match (&request.exactly, &request.first_available) {
                (Some(e), _) => vec![(request.name.clone(), e.device_class_name.as_str())],
                (None, Some(subs)) if !subs.is_empty() => subs
                    .iter()
                    .map(|s| {
                        (
                            format!("{}/{}", request.name, s.name),
                            s.device_class_name.as_str(),
                        )
                    })
                    .collect(),
                _ => {
                    return Ok(Some(ClaimProblem::UnknownRequestType {
                        claim: name,
                        request: request.name.clone(),
                    }));
                }
            };
            for (request, class) in classes {
                if class.is_empty() {
                    return Err(AllocateError::MissingClassName {
                        claim: name,
                        request,
                    });
                }
                if !inv.classes.contains_key(class) {
                    return Ok(Some(ClaimProblem::MissingClass {
                        claim: name,
                        request,
                        class: class.to_owned(),
                    }));
                }
            }
        }
    }
    Ok(None)
}

struct SlotSource<'a> {
    name: &'a str,
    class: &'a str,
    selectors: &'a [DeviceSelector],
    mode: Option<&'a str>,
    count: Option<i64>,
    admin_access: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<&'a CapacityRequirements>,
    derived_attributes: bool,
}

impl<'c> Plan<'c> {
    pub fn new(inv: &Cluster, claims: &'c [ResourceClaim]) -> Result<Plan<'c>, AllocateError> {
        let mut plan = Plan {
            claims: Vec::new(),
            slots: Vec::new(),
        };
        for (ci, claim) in claims.iter().enumerate() {
            plan.add_claim(inv, ci, claim)?;
        }
        Ok(plan)
    }

    fn add_claim(
        &mut self,
        inv: &Cluster,
        ci: usize,
        claim: &'c ResourceClaim,
    ) -> Result<(), AllocateError> {
        let name = claim_name(claim);
        let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
        let mut requests = Vec::new();
        let mut min_devices = 0usize;
        for request in devices
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default()
        {
            let (sources, first_available) = slot_sources(&name, request)?;
            let mut slots = Vec::new();
            let mut min_for_request = usize::MAX;
            for source in sources {
                let slot = Slot::new(inv, ci, &name, &request.name, first_available, source)?;
                min_for_request = min_for_request.min(match slot.wanted {
                    Wanted::Count(n) => n,
                    // "All" is at least one device; the real number depends on the node.
                    Wanted::All => 1,
                });
                slots.push(self.slots.len());
                self.slots.push(slot);
            }
            min_devices = min_devices.saturating_add(min_for_request);
            requests.push(RequestPlan {
                name: request.name.clone(),
                slots,
                first_available,
            });
        }
        if min_devices > MAX_RESULTS_PER_CLAIM {
            return Err(AllocateError::TooManyDevices {
                claim: name,
                count: min_devices,
                limit: MAX_RESULTS_PER_CLAIM,
            });
        }
        let constraints = constraints(
            &name,
            devices
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or_default(),
        )?;
        self.claims.push(ClaimPlan {
            claim,
            name,
            requests,
            constraints,
        });
        Ok(())
    }
}

/// The request itself, or its subrequests in order (with `true`).
fn slot_sources<'r>(
    claim: &str,
    request: &'r DeviceRequest,
) -> Result<(Vec<SlotSource<'r>>, bool), AllocateError> {
    match (&request.exactly, &request.first_available) {
        (Some(e), _) => Ok((
            vec![SlotSource {
                name: &request.name,
                class: &e.device_class_name,
                selectors: e.selectors.as_deref().unwrap_or_default(),
                mode: e.allocation_mode.as_deref(),
                count: e.count,
                admin_access: e.admin_access.unwrap_or(false),
                tolerations: e.tolerations.as_deref().unwrap_or_default(),
                capacity: e.capacity.as_ref(),
                derived_attributes: e.derived_attributes.as_ref().is_some_and(|d| !d.is_empty()),
            }],
            false,
        )),
        (None, Some(subs)) if !subs.is_empty() => Ok((
            subs.iter()
                .map(|s| SlotSource {
                    name: &s.name,
                    class: &s.device_class_name,
                    selectors: s.selectors.as_deref().unwrap_or_default(),
                    mode: s.allocation_mode.as_deref(),
                    count: s.count,
                    admin_access: false,
                    tolerations: s.tolerations.as_deref().unwrap_or_default(),
                    capacity: s.capacity.as_ref(),
                    derived_attributes: s
                        .derived_attributes
                        .as_ref()
                        .is_some_and(|d| !d.is_empty()),
                })
                .collect(),
            true,
        )),
        _ => Err(AllocateError::UnsupportedRequest {
            claim: claim.to_owned(),
            request: request.name.clone(),
        }),
    }
}

impl Slot {
    fn new(
        inv: &Cluster,
        claim: usize,
        claim_name: &str,
        request_name: &str,
        sub: bool,
        s: SlotSource<'_>,
    ) -> Result<Slot, AllocateError> {
        let full_name = if sub {
            format!("{request_name}/{}", s.name)
        } else {
            request_name.to_owned()
        };
        let owner = || format!("claim {claim_name}, request {full_name}");
        if s.derived_attributes {
            return Err(AllocateError::DerivedAttributes {
                claim: claim_name.to_owned(),
                request: full_name,
            });
        }
        for (index, selector) in s.selectors.iter().enumerate() {
            if selector.cel.is_none() {
                return Err(AllocateError::EmptySelector {
                    owner: owner(),
                    index,
                });
            }
        }
        if s.class.is_empty() {
            return Err(AllocateError::MissingClassName {
                claim: claim_name.to_owned(),
                request: full_name,
            });
        }
        if !inv.classes.contains_key(s.class) {
            return Err(AllocateError::UnknownClass {
                claim: claim_name.to_owned(),
                request: full_name.clone(),
                class: s.class.to_owned(),
            });
        }
        let selectors = inv
            .selectors
            .compile(s.selectors)
            .map_err(|EmptySelector { index }| AllocateError::EmptySelector {
                owner: owner(),
                index,
            })?;
        let wanted = wanted(claim_name, &full_name, s.mode, s.count)?;
        let capacity = capacity_requests(claim_name, &full_name, s.capacity)?;
        Ok(Slot {
            claim,
            full_name,
            request_name: request_name.to_owned(),
            class: s.class.to_owned(),
            selectors,
            wanted,
            admin_access: s.admin_access,
            tolerations: s.tolerations.to_vec(),
            capacity,
        })
    }
}

fn wanted(
    claim: &str,
    request: &str,
    mode: Option<&str>,
    count: Option<i64>,
) -> Result<Wanted, AllocateError> {
    match mode.unwrap_or("ExactCount") {
        "ExactCount" | "" => {
            let count = count.unwrap_or(1);
            if count < 1 {
                return Err(AllocateError::InvalidCount {
                    claim: claim.to_owned(),
                    request: request.to_owned(),
                    count,
                });
            }
            Ok(Wanted::Count(usize::try_from(count).unwrap_or(usize::MAX)))
        }
        "All" => Ok(Wanted::All),
        other => Err(AllocateError::UnsupportedAllocationMode {
            claim: claim.to_owned(),
            request: request.to_owned(),
            mode: other.to_owned(),
        }),
    }
}

fn capacity_requests(
    claim: &str,
    request: &str,
    requirements: Option<&CapacityRequirements>,
) -> Result<Vec<(String, Amount, Quantity)>, AllocateError> {
    requirements
        .and_then(|c| c.requests.as_ref())
        .into_iter()
        .flatten()
        .map(|(cap, q)| {
            let amount =
                Amount::from_quantity(q).map_err(|e| AllocateError::InvalidCapacityRequest {
                    claim: claim.to_owned(),
                    request: request.to_owned(),
                    capacity: cap.clone(),
                    message: e.to_string(),
                })?;
            Ok((cap.clone(), amount, q.clone()))
        })
        .collect()
}

fn constraints(
    claim: &str,
    constraints: &[DeviceConstraint],
) -> Result<Vec<ConstraintSpec>, AllocateError> {
    constraints
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
                (Some(a), _) => (ConstraintKind::Match, a.clone()),
                (None, Some(a)) => (ConstraintKind::Distinct, a.clone()),
                (None, None) => {
                    return Err(AllocateError::EmptyConstraint {
                        claim: claim.to_owned(),
                        index,
                    });
                }
            };
            Ok(ConstraintSpec {
                kind,
                attribute,
                requests: c.requests.clone().unwrap_or_default(),
            })
        })
        .collect()
}
