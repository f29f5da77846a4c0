//! The claims to allocate as the allocator reads them on one node: each request with its
//! alternatives (one, or the subrequests of `firstAvailable` in order), each alternative's class,
//! selectors, mode and count, and each claim's constraints — after the checks made before any
//! device is tried, in upstream's order: a request that cannot be read, an `All` request (whose
//! devices are fixed here: every device of the node that matches, so every pool must be usable),
//! more than 32 devices for one claim, a constraint of no known kind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequest, DeviceSelector, DeviceToleration, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::alternative::{AllocationMode, Alternative};
use super::checks;
use super::pools::{NodeView, PoolState};
use super::quantity::Nanos;
use super::selectors::SelectorTable;
use super::stop::{NodeStop, beyond};

/// The most devices one claim's allocation holds.
pub const MAX_RESULTS: usize = 32;

/// A request: its alternatives in order of preference.
#[derive(Debug)]
pub struct Request<'a> {
    pub name: &'a str,
    pub alternatives: Vec<Alternative<'a>>,
}

/// `matchAttribute` or `distinctAttribute` over some requests (none listed: all).
#[derive(Debug)]
pub struct Constraint<'a> {
    pub distinct: bool,
    pub attribute: &'a str,
    pub requests: &'a [String],
}

impl Constraint<'_> {
    /// Whether the constraint covers an alternative (by its request's or its own full name).
    pub fn covers(&self, alt: &Alternative<'_>) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| r == alt.base)
            || (alt.sub.is_some() && self.requests.contains(&alt.name()))
    }
}

/// A claim ready to search.
#[derive(Debug)]
pub struct ClaimPlan<'a> {
    pub claim: &'a ResourceClaim,
    pub requests: Vec<Request<'a>>,
    pub constraints: Vec<Constraint<'a>>,
}

/// What the scheduler's PreFilter decides before any node: a request without a class name is an
/// error, one naming a class that does not exist or of no known kind makes the pod
/// unschedulable. `(outcome is an error, class)`.
pub fn prefilter(
    claims: &[ResourceClaim],
    classes: &[DeviceClass],
) -> Option<(bool, &'static str)> {
    let check = |class: &str| -> Option<(bool, &'static str)> {
        if class.is_empty() {
            return Some((true, "invalid-request"));
        }
        let known = classes
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(class));
        (!known).then_some((false, "missing-class"))
    };
    for claim in claims {
        for request in requests_of(claim) {
            if let Some(exact) = &request.exactly {
                if let Some(v) = check(&exact.device_class_name) {
                    return Some(v);
                }
            } else if let Some(subs) = request.first_available.as_ref().filter(|s| !s.is_empty()) {
                for sub in subs {
                    if let Some(v) = check(&sub.device_class_name) {
                        return Some(v);
                    }
                }
            } else {
                return Some((false, "unknown-request-type"));
            }
        }
    }
    None
}

fn requests_of(claim: &ResourceClaim) -> &[DeviceRequest] {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_deref())
        .unwrap_or_default()
}

/// Everything a node needs before the search: the claims' plans.
pub struct Planning<'a, 'v> {
    pub classes: &'a [DeviceClass],
    pub view: &'v NodeView<'a>,
    pub table: &'v SelectorTable,
    pub node: &'v Node,
}

impl<'a> Planning<'a, '_> {
    /// The plans of the claims, or the error (or unsupported input) that stops the node first.
    pub fn plans(&self, claims: &'a [ResourceClaim]) -> Result<Vec<ClaimPlan<'a>>, NodeStop> {
        let mut plans = Vec::new();
        for claim in claims {
            let mut requests = Vec::new();
            let mut least_devices = 0;
            let mut most_devices = 0;
            for request in requests_of(claim) {
                let alternatives = self.alternatives(request)?;
                let least = alternatives
                    .iter()
                    .map(|a| a.mode.count())
                    .min()
                    .unwrap_or(0);
                if least > MAX_RESULTS - least_devices {
                    return Err(NodeStop::Error("too-many-devices"));
                }
                least_devices += least;
                most_devices += alternatives
                    .iter()
                    .map(|a| a.mode.count())
                    .max()
                    .unwrap_or(0);
                requests.push(Request {
                    name: &request.name,
                    alternatives,
                });
            }
            let mut constraints = Vec::new();
            let listed = claim
                .spec
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or_default();
            for c in listed {
                let (distinct, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
                    (Some(a), _) => (false, a.as_str()),
                    (None, Some(a)) => (true, a.as_str()),
                    (None, None) => return Err(NodeStop::Error("invalid-request")),
                };
                constraints.push(Constraint {
                    distinct,
                    attribute,
                    requests: c.requests.as_deref().unwrap_or_default(),
                });
            }
            if most_devices > MAX_RESULTS {
                // Upstream then cuts the search short in ways the reference does not model.
                return Err(NodeStop::Beyond(beyond(
                    "a claim that may exceed 32 devices with some subrequests",
                )));
            }
            plans.push(ClaimPlan {
                claim,
                requests,
                constraints,
            });
        }
        Ok(plans)
    }

    /// A request's alternatives, each checked as upstream checks it before the search.
    fn alternatives(&self, request: &'a DeviceRequest) -> Result<Vec<Alternative<'a>>, NodeStop> {
        let mut out = Vec::new();
        if let Some(e) = &request.exactly {
            let parts = Parts {
                sub: None,
                class: &e.device_class_name,
                selectors: e.selectors.as_deref().unwrap_or_default(),
                mode: e.allocation_mode.as_deref().unwrap_or_default(),
                count: e.count.unwrap_or(0),
                admin: e.admin_access.unwrap_or(false),
                derived: e.derived_attributes.as_ref().is_some_and(|d| !d.is_empty()),
                tolerations: e.tolerations.as_deref().unwrap_or_default(),
                capacity: e.capacity.as_ref().and_then(|c| c.requests.clone()),
            };
            out.push(self.alternative(&request.name, parts)?);
        } else {
            for s in request.first_available.iter().flatten() {
                let parts = Parts {
                    sub: Some(&s.name),
                    class: &s.device_class_name,
                    selectors: s.selectors.as_deref().unwrap_or_default(),
                    mode: s.allocation_mode.as_deref().unwrap_or_default(),
                    count: s.count.unwrap_or(0),
                    admin: false,
                    derived: s.derived_attributes.as_ref().is_some_and(|d| !d.is_empty()),
                    tolerations: s.tolerations.as_deref().unwrap_or_default(),
                    capacity: s.capacity.as_ref().and_then(|c| c.requests.clone()),
                };
                out.push(self.alternative(&request.name, parts)?);
            }
        }
        Ok(out)
    }

    fn alternative(&self, base: &'a str, p: Parts<'a>) -> Result<Alternative<'a>, NodeStop> {
        if p.derived || p.selectors.iter().any(|s| s.cel.is_none()) {
            return Err(NodeStop::Error("invalid-request"));
        }
        let class = self
            .classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(p.class))
            .ok_or(NodeStop::Error("invalid-request"))?;
        let cel = |s: &'a DeviceSelector| s.cel.as_ref().map(|c| c.expression.as_str());
        let class_selectors = class
            .spec
            .as_ref()
            .and_then(|s| s.selectors.as_deref())
            .unwrap_or_default();
        if class_selectors.iter().any(|s| s.cel.is_none()) {
            return Err(NodeStop::Beyond(beyond("a class selector without CEL")));
        }
        let mut alt = Alternative {
            base,
            sub: p.sub,
            class,
            class_selectors: class_selectors.iter().filter_map(cel).collect(),
            request_selectors: p.selectors.iter().filter_map(cel).collect(),
            mode: AllocationMode::Exact(0),
            admin: p.admin,
            tolerations: p.tolerations,
            capacity: p.capacity.unwrap_or_default(),
        };
        alt.mode = match p.mode {
            "ExactCount" => AllocationMode::Exact(
                usize::try_from(p.count)
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| NodeStop::Beyond(beyond("an exact count below 1")))?,
            ),
            "All" => AllocationMode::All(self.all_devices(&alt)?),
            _ => return Err(NodeStop::Error("invalid-request")),
        };
        Ok(alt)
    }

    /// The devices an `All` alternative takes: every device of the node it matches, whose
    /// capacities could hold it on an idle device; every pool must be usable.
    fn all_devices(&self, alt: &Alternative<'a>) -> Result<Vec<usize>, NodeStop> {
        let mut devices = Vec::new();
        for (position, pool) in self.view.pools.iter().enumerate() {
            if pool.state != PoolState::Usable {
                return Err(NodeStop::Error("all-pool-unusable"));
            }
            for (i, cand) in self.view.candidates.iter().enumerate() {
                if cand.pool != position || !checks::selectable(self.table, alt, cand, self.node)? {
                    continue;
                }
                let nothing = |_: &str| Nanos::ZERO;
                if checks::capacity_fits(alt, cand.device, &nothing, &nothing)? {
                    devices.push(i);
                }
            }
        }
        Ok(devices)
    }
}

/// The fields of a request or subrequest the reference reads.
struct Parts<'a> {
    sub: Option<&'a str>,
    class: &'a str,
    selectors: &'a [DeviceSelector],
    mode: &'a str,
    count: i64,
    admin: bool,
    derived: bool,
    tolerations: &'a [DeviceToleration],
    capacity: Option<BTreeMap<String, Quantity>>,
}
