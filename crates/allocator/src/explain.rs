//! Why claims cannot be allocated, node by node and request by request: the account `tessera
//! explain` prints and the controller puts on pods.
//!
//! For every request (and subrequest) the account says how many devices the node has, how many
//! the class selectors match, how many the request selectors match, and why each matching device
//! is unavailable (in use, untolerated taint, counters exhausted, capacity); for every constraint,
//! how far the available devices are from satisfying it; and pool problems (incomplete, invalid).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::cluster::Cluster;
use crate::constraints::AttrSet;
use crate::error::AllocateError;
use crate::pools::{NodePools, PoolStatus};
use crate::request::{ClaimProblem, ConstraintKind, Plan, Wanted};
use crate::search::{NodeSearch, SearchMode};
use crate::selection::Verdict;
use crate::state::AllocatedState;
use crate::taints::untolerated_taint;

/// Devices listed by name per exclusion kind before the rest are only counted.
const LISTED_DEVICES: usize = 8;

/// Claims that fit on no node, with the reasons per node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unsatisfiable {
    /// A problem with the claims themselves, found before any node is tried (what
    /// kube-scheduler's PreFilter reports); then `nodes` is empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_problem: Option<ClaimProblem>,
    /// Every node evaluated, in the order tried.
    pub nodes: Vec<NodeExplanation>,
}

impl fmt::Display for Unsatisfiable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(problem) = &self.claim_problem {
            return writeln!(f, "{problem}");
        }
        if self.nodes.is_empty() {
            return writeln!(
                f,
                "no nodes to allocate on: no ResourceSlice names a node and no Node object was given"
            );
        }
        for node in &self.nodes {
            write!(f, "{node}")?;
        }
        Ok(())
    }
}

/// Why the claims do not fit on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeExplanation {
    /// Node name.
    pub node: String,
    /// The reasons, most specific first.
    pub reasons: Vec<Reason>,
}

impl NodeExplanation {
    /// The reasons as text, one line each (what `tessera explain -o json` prints).
    pub fn reason_lines(&self) -> Vec<String> {
        self.reasons.iter().flat_map(Reason::lines).collect()
    }

    /// A one-line account without evaluating devices again.
    pub(crate) fn brief(np: &NodePools) -> NodeExplanation {
        let mut reasons = pool_reasons(np);
        reasons.push(Reason::NoCombination);
        NodeExplanation {
            node: np.node.name.clone(),
            reasons,
        }
    }

    /// The full account for one node.
    pub(crate) fn diagnose(
        inv: &Cluster,
        np: &NodePools,
        state: &AllocatedState,
        plan: &Plan<'_>,
    ) -> Result<NodeExplanation, AllocateError> {
        let mut search = NodeSearch::new(inv, np, state, plan, SearchMode::FirstFit, u64::MAX)?;
        let mut reasons = pool_reasons(np);
        if np.candidates.is_empty() {
            reasons.push(Reason::NoDevices);
        }
        let mut accounts = Vec::new();
        for (si, slot) in plan.slots.iter().enumerate() {
            accounts.push(account(&mut search, plan, si, slot.wanted));
        }
        let mut blocked = false;
        for claim in &plan.claims {
            for request in &claim.requests {
                blocked |= request.slots.iter().all(|&s| accounts[s].short());
            }
        }
        let mut constraint_reasons = Vec::new();
        for (ci, claim) in plan.claims.iter().enumerate() {
            for (index, spec) in claim.constraints.iter().enumerate() {
                if let Some(c) = constraint_account(&search, plan, &accounts, ci, index, spec) {
                    constraint_reasons.push(Reason::Constraint(c));
                }
            }
        }
        let unexplained = !blocked && constraint_reasons.is_empty() && reasons.is_empty();
        reasons.extend(accounts.into_iter().map(|a| Reason::Request(a.public)));
        reasons.extend(constraint_reasons);
        if unexplained {
            reasons.push(Reason::NoCombination);
        }
        Ok(NodeExplanation {
            node: np.node.name.clone(),
            reasons,
        })
    }
}

impl fmt::Display for NodeExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "node {}: cannot allocate", self.node)?;
        for line in self.reason_lines() {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// One reason a node does not fit.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Reason {
    /// The node has no device in a usable pool.
    NoDevices,
    /// A pool has fewer slices than it announces (the driver is updating it).
    PoolIncomplete {
        pool: String,
        slices: usize,
        expected: i64,
    },
    /// A pool's slices contradict each other.
    PoolInvalid { pool: String, problem: String },
    /// How one request or subrequest fares on the node.
    Request(RequestAccount),
    /// A constraint the available devices cannot satisfy.
    Constraint(ConstraintAccount),
    /// Each request could be met alone, but not all together.
    NoCombination,
}

impl Reason {
    /// The reason as text lines.
    pub fn lines(&self) -> Vec<String> {
        match self {
            Reason::NoDevices => vec!["no devices: no usable ResourceSlice publishes devices for this node".into()],
            Reason::PoolIncomplete { pool, slices, expected } => vec![format!(
                "pool {pool} is incomplete ({slices} of {expected} slices published): nothing is allocated from it until the driver finishes updating it"
            )],
            Reason::PoolInvalid { pool, problem } => {
                vec![format!("pool {pool} is invalid ({problem}): nothing is allocated from it; fix the driver's slices")]
            }
            Reason::Request(r) => r.lines(),
            Reason::Constraint(c) => vec![c.to_string()],
            Reason::NoCombination => vec![
                "each request can be met on its own, but no combination of devices satisfies all requests and \
                 constraints together (devices wanted by several requests, shared counters, or capacity)"
                    .into(),
            ],
        }
    }
}

/// How many devices a request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WantedDevices {
    /// Exactly this many.
    Count(usize),
    /// All matching devices: this many on this node.
    All(usize),
}

/// How one request or subrequest fares on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestAccount {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// `req` or `req/sub`.
    pub request: String,
    /// DeviceClass name.
    pub class: String,
    pub wanted: WantedDevices,
    /// Devices of usable pools on the node.
    pub on_node: usize,
    /// Of those, matched by the class selectors.
    pub class_matched: usize,
    /// Of those, matched by the request selectors too.
    pub request_matched: usize,
    /// Of those, allocatable right now.
    pub available: usize,
    /// Matching devices that are not allocatable, and why.
    pub excluded: Vec<Exclusion>,
    /// Selectors that failed on a device (CEL runtime errors).
    pub selector_errors: Vec<String>,
    /// When no device matches the request selectors: the MIG profiles (`profile` attribute) of
    /// the devices that match the class, so a profile the node lacks shows what it has.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub profiles_on_node: BTreeSet<String>,
}

impl RequestAccount {
    fn wanted_count(&self) -> usize {
        match self.wanted {
            WantedDevices::Count(n) | WantedDevices::All(n) => n,
        }
    }

    /// Fewer available devices than wanted.
    pub fn short(&self) -> bool {
        self.available < self.wanted_count()
            || self.wanted == WantedDevices::All(0)
            || !self.selector_errors.is_empty()
    }

    fn lines(&self) -> Vec<String> {
        let wanted = match self.wanted {
            WantedDevices::Count(1) => "1 device".to_owned(),
            WantedDevices::Count(n) => format!("{n} devices"),
            WantedDevices::All(n) => format!("all matching devices ({n})"),
        };
        let verdict = if self.short() { " — not enough" } else { "" };
        let mut lines = vec![format!(
            "claim {}, request {} (class {}) wants {wanted}: {} devices on the node, {} match the class selectors, \
             {} match the request selectors, {} available{verdict}",
            self.claim,
            self.request,
            self.class,
            self.on_node,
            self.class_matched,
            self.request_matched,
            self.available
        )];
        let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for e in &self.excluded {
            groups
                .entry(e.reason.to_string())
                .or_default()
                .push(&e.device);
        }
        for (why, devices) in groups {
            let listed = devices
                .iter()
                .take(LISTED_DEVICES)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            let more = devices.len().saturating_sub(LISTED_DEVICES);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            lines.push(format!("  {why}: {listed}{more}"));
        }
        for e in &self.selector_errors {
            lines.push(format!("  selector error: {e}"));
        }
        if !self.profiles_on_node.is_empty() {
            let profiles: Vec<&str> = self.profiles_on_node.iter().map(String::as_str).collect();
            lines.push(format!(
                "  MIG profiles of the class's devices on this node: {}",
                profiles.join(", ")
            ));
        }
        lines
    }
}

/// A matching device that cannot be allocated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Exclusion {
    /// `driver/pool/device`.
    pub device: String,
    pub reason: ExclusionReason,
}

/// Why a matching device cannot be allocated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ExclusionReason {
    /// Allocated to another claim.
    InUse,
    /// Carries a taint the request does not tolerate.
    Taint {
        key: String,
        value: String,
        effect: String,
    },
    /// A shared counter of its pool is used up.
    Counters {
        counter_set: String,
        counter: String,
    },
    /// Its consumable capacity does not fit the request.
    Capacity { detail: String },
}

impl fmt::Display for ExclusionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExclusionReason::InUse => f.write_str("in use by another claim"),
            ExclusionReason::Taint { key, value, effect } => {
                write!(f, "taint {key}={value}:{effect} not tolerated")
            }
            ExclusionReason::Counters {
                counter_set,
                counter,
            } => {
                write!(
                    f,
                    "shared counter {counter_set}/{counter} of its pool used up"
                )
            }
            ExclusionReason::Capacity { detail } => write!(f, "capacity: {detail}"),
        }
    }
}

/// A constraint the available devices cannot satisfy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConstraintAccount {
    pub claim: String,
    /// Index in `spec.devices.constraints`.
    pub index: usize,
    /// `matchAttribute` or `distinctAttribute`.
    pub kind: String,
    pub attribute: String,
    /// Devices the constrained requests need together.
    pub needed: usize,
    /// matchAttribute: the most available devices sharing one value; distinctAttribute: the
    /// number of distinct values among available devices.
    pub best: usize,
    /// Available devices without the attribute.
    pub lacking: usize,
    /// Available devices per attribute value.
    pub values: BTreeMap<String, usize>,
}

impl fmt::Display for ConstraintAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values: Vec<String> = self
            .values
            .iter()
            .map(|(v, n)| format!("{v}: {n}"))
            .collect();
        let what = if self.kind == "matchAttribute" {
            "the most available devices sharing one value"
        } else {
            "distinct values among available devices"
        };
        write!(
            f,
            "claim {}, constraint #{} {} {}: {} needed, {what}: {} (values {{{}}}; {} available devices lack the attribute)",
            self.claim,
            self.index,
            self.kind,
            self.attribute,
            self.needed,
            self.best,
            values.join(", "),
            self.lacking
        )
    }
}

fn pool_reasons(np: &NodePools) -> Vec<Reason> {
    np.pools
        .iter()
        .filter_map(|p| match &p.status {
            PoolStatus::Usable => None,
            PoolStatus::Incomplete { have, want } => Some(Reason::PoolIncomplete {
                pool: p.id(),
                slices: *have,
                expected: *want,
            }),
            PoolStatus::Invalid(problem) => Some(Reason::PoolInvalid {
                pool: p.id(),
                problem: problem.clone(),
            }),
        })
        .collect()
}

/// A request account plus the candidate positions that are available.
struct SlotAccount {
    public: RequestAccount,
    available: Vec<usize>,
}

impl SlotAccount {
    fn short(&self) -> bool {
        self.public.short()
    }
}

fn account(search: &mut NodeSearch<'_>, plan: &Plan<'_>, si: usize, wanted: Wanted) -> SlotAccount {
    let slot = &plan.slots[si];
    let inv = search.inv;
    let class = &inv.classes[&slot.class];
    let n = search.np.candidates.len();
    let mut public = RequestAccount {
        claim: plan.claims[slot.claim].name.clone(),
        request: slot.full_name.clone(),
        class: slot.class.clone(),
        wanted: match wanted {
            Wanted::Count(c) => WantedDevices::Count(c),
            Wanted::All => WantedDevices::All(search.need(si)),
        },
        on_node: n,
        class_matched: 0,
        request_matched: 0,
        available: 0,
        excluded: Vec::new(),
        selector_errors: Vec::new(),
        profiles_on_node: BTreeSet::new(),
    };
    let mut available = Vec::new();
    for pos in 0..n {
        let index = search.np.candidates[pos];
        match class.verdict(&inv.selectors, &inv.devices, index) {
            Verdict::Match => {
                public.class_matched += 1;
                let profile = search.device(pos).attribute(PROFILE_ATTRIBUTE);
                if let Some(profile) = profile.and_then(|a| a.string.clone()) {
                    public.profiles_on_node.insert(profile);
                }
            }
            Verdict::NoMatch(_) => continue,
            Verdict::Failed { .. } => {
                if let Err(e) = search.pairs().verdict(si, pos) {
                    public.selector_errors.push(e.to_string());
                }
                continue;
            }
        }
        match search.pairs().verdict(si, pos) {
            Ok(true) => public.request_matched += 1,
            Ok(false) => continue,
            Err(e) => {
                public.selector_errors.push(e.to_string());
                continue;
            }
        }
        let device = search.device(pos);
        let reason = exclusion(search, si, pos);
        match reason {
            Some(reason) => public.excluded.push(Exclusion {
                device: device.id.to_string(),
                reason,
            }),
            None => {
                public.available += 1;
                available.push(pos);
            }
        }
    }
    if public.request_matched > 0 {
        public.profiles_on_node.clear();
    }
    SlotAccount { public, available }
}

/// The attribute a MIG device's profile is published as (bare: the device's driver's domain).
const PROFILE_ATTRIBUTE: &str = "profile";

/// Why a device matching the slot cannot be allocated now, if it cannot.
fn exclusion(search: &NodeSearch<'_>, si: usize, pos: usize) -> Option<ExclusionReason> {
    let slot = &search.plan.slots[si];
    let device = search.device(pos);
    if !slot.admin_access && search.in_use(pos) {
        return Some(ExclusionReason::InUse);
    }
    if let Some(t) = untolerated_taint(device.taints(), &slot.tolerations) {
        return Some(ExclusionReason::Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone(),
        });
    }
    if !search.np.candidate_consumes[pos].is_empty()
        && let Some(i) = search.counter_shortfall(pos)
    {
        let (counter_set, counter) =
            search.np.pools[search.np.candidate_pool[pos]].counter_names[i].clone();
        return Some(ExclusionReason::Counters {
            counter_set,
            counter,
        });
    }
    search
        .capacity(si, pos)
        .err()
        .map(|refusal| ExclusionReason::Capacity {
            detail: refusal.to_string(),
        })
}

fn constraint_account(
    search: &NodeSearch<'_>,
    plan: &Plan<'_>,
    accounts: &[SlotAccount],
    ci: usize,
    index: usize,
    spec: &crate::request::ConstraintSpec,
) -> Option<ConstraintAccount> {
    let claim = &plan.claims[ci];
    let mut needed = 0;
    let mut positions: Vec<usize> = Vec::new();
    for request in &claim.requests {
        let applicable: Vec<usize> = request
            .slots
            .iter()
            .copied()
            .filter(|&s| spec.applies_to(&plan.slots[s]))
            .collect();
        if let Some(min) = applicable.iter().map(|&s| search.need(s)).min() {
            needed += min;
        }
        for s in applicable {
            positions.extend(&accounts[s].available);
        }
    }
    positions.sort_unstable();
    positions.dedup();
    let mut values: BTreeMap<String, usize> = BTreeMap::new();
    let mut lacking = 0;
    for &pos in &positions {
        match search
            .device(pos)
            .attribute(&spec.attribute)
            .and_then(AttrSet::of)
        {
            Some(set) => *values.entry(set.to_string()).or_default() += 1,
            None => lacking += 1,
        }
    }
    let best = match spec.kind {
        ConstraintKind::Match => values.values().copied().max().unwrap_or(0),
        ConstraintKind::Distinct => values.len(),
    };
    (best < needed).then(|| ConstraintAccount {
        claim: claim.name.clone(),
        index,
        kind: match spec.kind {
            ConstraintKind::Match => "matchAttribute",
            ConstraintKind::Distinct => "distinctAttribute",
        }
        .into(),
        attribute: spec.attribute.clone(),
        needed,
        best,
        lacking,
        values,
    })
}
