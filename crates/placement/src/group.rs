//! Groups (gangs): gated pods that are placed together or not at all, close together across
//! nodes. A function of data like the rest of the crate; the controller carries a
//! [`GroupDecision`] out and `tessera explain --group` prints it.
//!
//! **Membership.** A pod names its group with the upstream field `spec.schedulingGroup.podGroupName`
//! (a `scheduling.k8s.io/v1beta1` PodGroup with a `gang` policy gives `minCount`), or, where the
//! cluster does not serve that API, with the label [`GROUP_LABEL`] and the annotation
//! [`GROUP_MIN_COUNT_ANNOTATION`] (docs/user-guide.md, "Training jobs as gangs").
//!
//! **All or nothing.** [`decide_group`] places at least `minCount` pods (less those already
//! placed) in one decision, each pod's claims on one node as [`crate::view::decide_pod`] places
//! them, every pod against the devices the pods before it took; or it places none.
//!
//! **Across nodes.** Domains are tried level by level, finest first: one fabric clique (the
//! published `fabricClique` attribute), then one value of each node label of the
//! [`Hierarchy`] (rack, block, zone by default), then the whole cluster. Within a domain each pod
//! goes to the sub-domain (the level below) the group already uses if it fits there, otherwise
//! to the emptiest remaining one, so a group spans as few sub-domains as it can. At the first level
//! where some domain holds the group, up to [`ALTERNATIVES`] domains are tried (fullest first: best
//! fit leaves large domains whole for large groups) and the best [`GroupScore`] wins. Every pod
//! decision counts one step against a budget; past it the best group found is kept (or the group
//! waits), so the decision's cost is bounded whatever the cluster.
//!
//! **No starvation.** [`held_back_by`]: a group that could run on the cluster's devices when free
//! and has waited longer than the hold time holds back every pod and group that arrived after it,
//! so devices that free up are not taken by later arrivals (docs/protocol.md, "Groups").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tessera_allocator::{AllocatedState, DeviceIndex};
use tessera_api::names::{
    BLOCK_LABEL, DRIVER_NAME, GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, RACK_LABEL, attr,
};

use crate::claims::allocation;
use crate::planner::{Action, Decision, Failure};
use crate::pods::pod_usage_requests;
use crate::protocol::object_key;
use crate::reason::PodReason;
use crate::resolve::PodClaim;
use crate::resources::NodeUsage;
use crate::view::{ClusterSnapshot, PodContext, Settings, decide_pod_within};

/// Domains tried at the level where the group first fits, before the best is kept.
pub const ALTERNATIVES: usize = 4;

/// Default step budget of a group decision: pod decisions, each over one domain's nodes.
pub const DEFAULT_GROUP_BUDGET: usize = 4096;

/// Default time a group waits for capacity before it holds back later arrivals.
pub const DEFAULT_GROUP_HOLD: SignedDuration = SignedDuration::from_secs(60);

/// The zone label (Kubernetes' well-known label), the coarsest default level.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// How a group is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupSource {
    /// `spec.schedulingGroup.podGroupName`: a `scheduling.k8s.io/v1beta1` PodGroup.
    PodGroup,
    /// The label [`GROUP_LABEL`] with the annotation [`GROUP_MIN_COUNT_ANNOTATION`].
    Label,
}

/// A group: namespace, name and how it is named.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub namespace: String,
    pub name: String,
    pub source: GroupSource,
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            GroupSource::PodGroup => write!(f, "PodGroup {}/{}", self.namespace, self.name),
            GroupSource::Label => write!(f, "group {}/{}", self.namespace, self.name),
        }
    }
}

/// Bad group input: each names the object, the field and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error(
        "pod {pod}: annotation {GROUP_MIN_COUNT_ANNOTATION}={value:?} is not a positive integer; set it to how many of the group's pods must start together"
    )]
    BadMinCount { pod: String, value: String },
    #[error(
        "pod {pod}: label {GROUP_LABEL}={group} needs the annotation {GROUP_MIN_COUNT_ANNOTATION} (how many of the group's pods must start together)"
    )]
    MissingMinCount { pod: String, group: String },
    #[error(
        "pods of {group} disagree on annotation {GROUP_MIN_COUNT_ANNOTATION}: pod {pod} says {value}, an earlier pod {first}; give every pod of the group the same value"
    )]
    ConflictingMinCount {
        group: String,
        pod: String,
        value: u32,
        first: u32,
    },
    #[error(
        "PodGroup {group}: spec.schedulingPolicy.gang.minCount is {value}; it must be a positive integer"
    )]
    BadPodGroupMinCount { group: String, value: i32 },
    #[error(
        "topology levels {value:?}: entry {index} is empty; give node label keys separated by commas, finest first (e.g. {RACK_LABEL},{BLOCK_LABEL})"
    )]
    EmptyLevel { value: String, index: usize },
}

/// The group `pod` names, if any: the PodGroup of `spec.schedulingGroup.podGroupName` first, else
/// the label [`GROUP_LABEL`]. An empty name is no group.
pub fn group_key(pod: &Pod) -> Option<GroupKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(name) = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_group.as_ref())
        .and_then(|g| g.pod_group_name.as_deref())
        .filter(|n| !n.is_empty())
    {
        return Some(GroupKey {
            namespace,
            name: name.to_owned(),
            source: GroupSource::PodGroup,
        });
    }
    let name = pod
        .metadata
        .labels
        .as_ref()?
        .get(GROUP_LABEL)
        .filter(|n| !n.is_empty())?;
    Some(GroupKey {
        namespace,
        name: name.clone(),
        source: GroupSource::Label,
    })
}

/// A label-named group's `minCount`, from the pods' annotations (all that carry it must agree).
pub fn label_min_count<'p>(
    key: &GroupKey,
    pods: impl IntoIterator<Item = &'p Pod>,
) -> Result<u32, GroupError> {
    let mut found: Option<u32> = None;
    let mut first_pod = None;
    for pod in pods {
        let name = object_key(&pod.metadata);
        first_pod.get_or_insert_with(|| name.clone());
        let Some(value) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GROUP_MIN_COUNT_ANNOTATION))
        else {
            continue;
        };
        let count = value
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| GroupError::BadMinCount {
                pod: name.clone(),
                value: value.clone(),
            })?;
        match found {
            Some(first) if first != count => {
                return Err(GroupError::ConflictingMinCount {
                    group: key.to_string(),
                    pod: name,
                    value: count,
                    first,
                });
            }
            _ => found = Some(count),
        }
    }
    found.ok_or_else(|| GroupError::MissingMinCount {
        pod: first_pod.unwrap_or_default(),
        group: key.name.clone(),
    })
}

/// A PodGroup's `minCount`: `Some` for a gang policy, `None` for the basic policy (its pods are
/// placed one by one).
pub fn pod_group_min_count(group: &PodGroup) -> Result<Option<u32>, GroupError> {
    let Some(gang) = group.spec.scheduling_policy.gang.as_ref() else {
        return Ok(None);
    };
    u32::try_from(gang.min_count)
        .ok()
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| GroupError::BadPodGroupMinCount {
            group: object_key(&group.metadata),
            value: gang.min_count,
        })
}

/// The node-label hierarchy of topology domains, finest first (the controller's
/// `--topology-levels`, chart value `controller.topologyLevels`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    pub labels: Vec<String>,
}

impl Default for Hierarchy {
    /// [`RACK_LABEL`], [`BLOCK_LABEL`], [`ZONE_LABEL`].
    fn default() -> Hierarchy {
        Hierarchy {
            labels: vec![RACK_LABEL.into(), BLOCK_LABEL.into(), ZONE_LABEL.into()],
        }
    }
}

impl Hierarchy {
    /// Parses `key,key,...` (finest first). An empty string is no label level at all.
    pub fn parse(value: &str) -> Result<Hierarchy, GroupError> {
        if value.trim().is_empty() {
            return Ok(Hierarchy { labels: Vec::new() });
        }
        let mut labels = Vec::new();
        for (index, part) in value.split(',').enumerate() {
            let part = part.trim();
            if part.is_empty() {
                return Err(GroupError::EmptyLevel {
                    value: value.to_owned(),
                    index,
                });
            }
            labels.push(part.to_owned());
        }
        Ok(Hierarchy { labels })
    }
}

/// How group decisions are made.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupSettings {
    pub hierarchy: Hierarchy,
    /// Pod decisions one group decision may take.
    pub budget: usize,
    /// Also decide each waiting pod alone against the whole cluster, for the account (explain).
    pub accounts: bool,
}

impl Default for GroupSettings {
    fn default() -> GroupSettings {
        GroupSettings {
            hierarchy: Hierarchy::default(),
            budget: DEFAULT_GROUP_BUDGET,
            accounts: false,
        }
    }
}

/// A gated pod of the group whose claims are resolved.
#[derive(Clone, Copy)]
pub struct Member<'a> {
    pub pod: &'a Pod,
    pub claims: &'a [PodClaim],
}

/// What one group decision reads besides the cluster.
pub struct GroupInput<'a> {
    pub key: &'a GroupKey,
    pub min_count: u32,
    /// Pods of the group already placed (released or bound): they count toward `min_count`.
    pub placed: u32,
    /// Pods to place, in the order to try them (arrival, then name).
    pub members: Vec<Member<'a>>,
    /// Pods of the group still waiting for their claims to be created.
    pub unresolved: u32,
}

impl GroupInput<'_> {
    /// How many of `members` must be placed in this decision.
    pub fn needed(&self) -> usize {
        self.min_count.saturating_sub(self.placed) as usize
    }
}

/// How close a group's pods are; lower is better, compared field by field in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GroupScore {
    /// The pods' nodes are not all in one fabric clique (only when some node publishes one).
    pub outside_one_clique: bool,
    /// Distinct domains per label level (a node without the label counts as its own domain).
    pub domains: Vec<usize>,
    /// Distinct nodes.
    pub nodes: usize,
    /// Sum over the pods of the in-node communication cost, then of NUMA nodes spanned.
    pub comm_cost: u64,
    pub numa_nodes_spanned: u32,
}

/// Where the group went, for messages: `rack=r1 (gpu.tessera.dev/rack)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// `fabricClique`, a label key, or `cluster`.
    pub level: String,
    pub value: String,
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.level == "cluster" {
            f.write_str("the whole cluster")
        } else {
            write!(f, "{}={}", self.level, self.value)
        }
    }
}

/// A member that was not placed in the attempt reported, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAccount {
    pub pod: String,
    /// Where it was placed (in the attempt), or `None`.
    pub node: Option<String>,
    pub message: String,
}

/// The group's decision.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupOutcome {
    /// Carry out each member's decision (index into [`GroupInput::members`]); members not listed
    /// stay gated for a later decision.
    Place {
        decisions: Vec<(usize, Decision)>,
        domain: Domain,
        score: GroupScore,
    },
    /// Place nothing now.
    Wait {
        failure: Failure,
        /// The condition reason: `WaitingForGroup` (pods or claims missing),
        /// `GroupUnsatisfiable` or `InvalidInput`.
        reason: PodReason,
        message: String,
        /// The closest attempt (or each pod alone with [`GroupSettings::accounts`]).
        pods: Vec<PodAccount>,
    },
}

/// A group decision and what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDecision {
    pub outcome: GroupOutcome,
    /// Pod decisions taken.
    pub steps: usize,
    /// The budget ran out: the group found may not be the best (or one may exist).
    pub truncated: bool,
}

/// One level of domains: each node's value (indexed like [`ClusterSnapshot::nodes`]).
struct Level {
    name: String,
    of_node: Vec<Option<String>>,
}

/// Each node's fabric clique: the `fabricClique` attribute of its first managed device.
fn clique_level(devices: &ClusterSnapshot) -> Option<Level> {
    let qualified = format!("{DRIVER_NAME}/{}", attr::FABRIC_CLIQUE);
    let of_node: Vec<Option<String>> = devices
        .nodes
        .iter()
        .map(|n| node_clique(&devices.managed, &n.info.name, &qualified))
        .collect();
    of_node.iter().any(Option::is_some).then(|| Level {
        name: attr::FABRIC_CLIQUE.to_owned(),
        of_node,
    })
}

fn node_clique(inventory: &DeviceIndex, node: &str, qualified: &str) -> Option<String> {
    inventory.node_devices(node).find_map(|(_, device)| {
        let attributes = device.attributes.as_ref()?;
        attributes
            .get(qualified)
            .or_else(|| attributes.get(attr::FABRIC_CLIQUE))?
            .string
            .clone()
            .filter(|s| !s.is_empty())
    })
}

fn label_levels(devices: &ClusterSnapshot, hierarchy: &Hierarchy) -> Vec<Level> {
    hierarchy
        .labels
        .iter()
        .map(|key| Level {
            name: key.clone(),
            of_node: devices
                .nodes
                .iter()
                .map(|n| n.info.labels.get(key).cloned())
                .collect(),
        })
        .collect()
}

/// Free (not in use) managed devices per node.
fn free_devices(devices: &ClusterSnapshot, in_use: &AllocatedState) -> Vec<usize> {
    devices
        .nodes
        .iter()
        .map(|n| {
            devices
                .managed
                .node_devices(&n.info.name)
                .filter(|(id, _)| !in_use.is_in_use(id))
                .count()
        })
        .collect()
}

/// A successful or partial attempt in one domain.
struct Attempt {
    placed: Vec<(usize, Decision)>,
    /// Members not placed, with the last reason.
    missed: Vec<(usize, String)>,
}

/// The search's shared state.
struct Search<'a, 'c> {
    input: &'a GroupInput<'a>,
    context: &'a PodContext<'c>,
    settings: &'a Settings,
    now: Timestamp,
    budget: usize,
    steps: usize,
    truncated: bool,
}

impl Search<'_, '_> {
    /// Places members in `nodes`, packing them into `subdomains` (groups of `nodes`, in order of
    /// preference; the ones already used come first).
    fn attempt(&mut self, subdomains: &[Vec<usize>]) -> Attempt {
        let mut state = self.context.in_use.clone();
        let mut usage: HashMap<String, NodeUsage> = self.context.usage.clone();
        let mut used: Vec<usize> = Vec::new();
        let mut attempt = Attempt {
            placed: Vec::new(),
            missed: Vec::new(),
        };
        let needed = self.input.needed();
        let total = self.input.members.len();
        for (index, member) in self.input.members.iter().enumerate() {
            if attempt.placed.len() + (total - index) < needed {
                attempt
                    .missed
                    .extend((index..total).map(|i| (i, "not tried".to_owned())));
                break;
            }
            let order: Vec<usize> = used
                .iter()
                .copied()
                .chain((0..subdomains.len()).filter(|s| !used.contains(s)))
                .collect();
            let mut last = String::from("no node of the domain is eligible");
            let mut done = false;
            for sub in order {
                if self.steps >= self.budget {
                    self.truncated = true;
                    break;
                }
                self.steps += 1;
                let context = PodContext {
                    devices: self.context.devices,
                    unmanaged: self.context.unmanaged,
                    in_use: &state,
                    usage: &usage,
                };
                let decision = decide_pod_within(
                    member.pod,
                    member.claims,
                    &context,
                    self.settings,
                    self.now,
                    Some(subdomains[sub].as_slice()),
                );
                match &decision.action {
                    Action::Place(p) => {
                        for claim in &p.undo {
                            if let Some(a) = allocation(claim) {
                                let _ = state.remove_allocation(a);
                            }
                        }
                        for write in &p.writes {
                            let _ = state.add_allocation(&write.allocation);
                        }
                        usage
                            .entry(p.node.clone())
                            .or_default()
                            .add_pod(pod_usage_requests(member.pod));
                    }
                    Action::Release { .. } | Action::Nothing => {}
                    Action::CannotPlace { message, .. } | Action::LeaveToScheduler { message } => {
                        last = message.clone();
                        continue;
                    }
                }
                if !used.contains(&sub) {
                    used.push(sub);
                }
                attempt.placed.push((index, decision));
                done = true;
                break;
            }
            if !done {
                attempt.missed.push((index, last));
            }
        }
        attempt
    }
}

/// The node a decision places on, if any.
fn decision_node(decision: &Decision) -> Option<&str> {
    match &decision.action {
        Action::Place(p) => Some(&p.node),
        Action::Release { node } => node.as_deref(),
        _ => None,
    }
}

fn score(
    placed: &[(usize, Decision)],
    clique: Option<&Level>,
    labels: &[Level],
    index: &HashMap<String, usize>,
) -> GroupScore {
    let nodes: BTreeSet<&str> = placed
        .iter()
        .filter_map(|(_, d)| decision_node(d))
        .collect();
    let distinct = |level: &Level| -> usize {
        let mut values = BTreeSet::new();
        let mut unlabelled = 0;
        for node in &nodes {
            match index.get(*node).and_then(|&i| level.of_node[i].as_ref()) {
                Some(v) => {
                    values.insert(v.clone());
                }
                None => unlabelled += 1,
            }
        }
        values.len() + unlabelled
    };
    let mut score = GroupScore {
        outside_one_clique: clique.is_some_and(|c| {
            let values: BTreeSet<Option<&String>> = nodes
                .iter()
                .map(|n| index.get(*n).and_then(|&i| c.of_node[i].as_ref()))
                .collect();
            values.len() > 1 || values.contains(&None)
        }),
        domains: labels.iter().map(distinct).collect(),
        nodes: nodes.len(),
        ..GroupScore::default()
    };
    for (_, d) in placed {
        if let Action::Place(p) = &d.action {
            score.comm_cost += p.score.comm_cost;
            score.numa_nodes_spanned += p.score.numa_nodes_spanned;
        }
    }
    score
}

/// Groups `nodes` by their value at `level` (no level: all in one group, the planner picks the
/// node; a node without the label: a group of its own), emptiest (most free devices) first.
fn subdomains(nodes: &[usize], level: Option<&Level>, free: &[usize]) -> Vec<Vec<usize>> {
    if level.is_none() {
        return vec![nodes.to_vec()];
    }
    let mut groups: BTreeMap<(u8, String), Vec<usize>> = BTreeMap::new();
    for &n in nodes {
        let key = match level.and_then(|l| l.of_node[n].clone()) {
            Some(v) => (0, v),
            None => (1, n.to_string()),
        };
        groups.entry(key).or_default().push(n);
    }
    let mut out: Vec<Vec<usize>> = groups.into_values().collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.iter().map(|&n| free[n]).sum::<usize>()));
    out
}

/// The group waits for pods (or their claims) that do not exist yet.
fn short_of_pods(input: &GroupInput<'_>) -> Option<GroupDecision> {
    let needed = input.needed();
    let have = input.members.len();
    if have >= needed {
        return None;
    }
    let missing = needed - have;
    let claims = if input.unresolved > 0 {
        format!(
            " ({} of them exist but wait for their claims to be created)",
            input.unresolved
        )
    } else {
        String::new()
    };
    Some(GroupDecision {
        outcome: GroupOutcome::Wait {
            failure: Failure::Unsatisfiable,
            reason: PodReason::WaitingForGroup,
            message: format!(
                "{} needs {} pods placed together (minCount {}, {} placed already); {} of them are gated \
                 here with their claims, waiting for {missing} more{claims}",
                input.key, needed, input.min_count, input.placed, have
            ),
            pods: Vec::new(),
        },
        steps: 0,
        truncated: false,
    })
}

/// The cluster's domains as one group decision reads them.
struct Layout {
    /// Node name → index into [`ClusterSnapshot::nodes`].
    index: HashMap<String, usize>,
    /// Nodes with managed devices.
    managed: Vec<usize>,
    /// Free devices per node.
    free: Vec<usize>,
    clique: Option<Level>,
    labels: Vec<Level>,
}

impl Layout {
    fn new(context: &PodContext<'_>, group: &GroupSettings) -> Layout {
        let devices = context.devices;
        Layout {
            index: devices
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.info.name.clone(), i))
                .collect(),
            managed: (0..devices.nodes.len())
                .filter(|&i| devices.managed_nodes.contains(&devices.nodes[i].info.name))
                .collect(),
            free: free_devices(devices, context.in_use),
            clique: clique_level(devices),
            labels: label_levels(devices, &group.hierarchy),
        }
    }

    /// The levels some managed node has a value at, finest first.
    fn levels(&self) -> Vec<&Level> {
        self.clique
            .iter()
            .chain(self.labels.iter())
            .filter(|l| self.managed.iter().any(|&n| l.of_node[n].is_some()))
            .collect()
    }

    /// The domains at `depth` of `levels` (past the last: the whole cluster), fullest first, and
    /// the level below them.
    fn domains<'l>(
        &self,
        levels: &[&'l Level],
        depth: usize,
    ) -> (Vec<(Domain, Vec<usize>)>, Option<&'l Level>) {
        let Some(level) = levels.get(depth) else {
            let all = Domain {
                level: "cluster".into(),
                value: String::new(),
            };
            return (vec![(all, self.managed.clone())], levels.last().copied());
        };
        let mut by_value: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &n in &self.managed {
            if let Some(v) = level.of_node[n].as_deref() {
                by_value.entry(v).or_default().push(n);
            }
        }
        let mut domains: Vec<(Domain, Vec<usize>)> = by_value
            .into_iter()
            .map(|(v, nodes)| {
                let domain = Domain {
                    level: level.name.clone(),
                    value: v.to_owned(),
                };
                (domain, nodes)
            })
            .collect();
        // Best fit: the fullest domain first, so large domains stay whole.
        domains.sort_by_key(|(_, nodes)| nodes.iter().map(|&n| self.free[n]).sum::<usize>());
        (domains, depth.checked_sub(1).map(|d| levels[d]))
    }
}

/// The best group in the domains of one level, and the closest failed attempt so far.
fn search_level(
    search: &mut Search<'_, '_>,
    layout: &Layout,
    domains: Vec<(Domain, Vec<usize>)>,
    sub_level: Option<&Level>,
    closest: &mut Option<(Domain, Attempt)>,
) -> Option<(GroupScore, Domain, Attempt)> {
    let needed = search.input.needed().max(1);
    let mut best: Option<(GroupScore, Domain, Attempt)> = None;
    let mut successes = 0;
    for (domain, nodes) in domains {
        if search.steps >= search.budget {
            search.truncated = true;
            break;
        }
        let attempt = search.attempt(&subdomains(&nodes, sub_level, &layout.free));
        if attempt.placed.len() >= needed {
            let s = score(
                &attempt.placed,
                layout.clique.as_ref(),
                &layout.labels,
                &layout.index,
            );
            if best.as_ref().is_none_or(|(b, _, _)| s < *b) {
                best = Some((s, domain, attempt));
            }
            successes += 1;
            if successes >= ALTERNATIVES {
                break;
            }
        } else if closest
            .as_ref()
            .is_none_or(|(_, c)| attempt.placed.len() > c.placed.len())
        {
            *closest = Some((domain, attempt));
        }
    }
    best
}

/// Decides the group: places at least [`GroupInput::needed`] members close together, or none.
pub fn decide_group(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
) -> GroupDecision {
    if let Some(waiting) = short_of_pods(input) {
        return waiting;
    }
    let layout = Layout::new(context, group);
    let levels = layout.levels();
    let mut search = Search {
        input,
        context,
        settings,
        now,
        budget: group.budget,
        steps: 0,
        truncated: false,
    };
    // The closest failed attempt: most members placed.
    let mut closest: Option<(Domain, Attempt)> = None;
    for depth in 0..=levels.len() {
        let (domains, sub_level) = layout.domains(&levels, depth);
        if let Some((score, domain, attempt)) =
            search_level(&mut search, &layout, domains, sub_level, &mut closest)
        {
            return GroupDecision {
                outcome: GroupOutcome::Place {
                    decisions: attempt.placed,
                    domain,
                    score,
                },
                steps: search.steps,
                truncated: search.truncated,
            };
        }
    }
    let (steps, truncated) = (search.steps, search.truncated);
    let outcome = wait_outcome(input, context, settings, group, now, closest, truncated);
    GroupDecision {
        outcome,
        steps,
        truncated,
    }
}

fn pod_name(member: &Member<'_>) -> String {
    object_key(&member.pod.metadata)
}

/// What the closest attempt placed and what it missed: a summary and the pods' accounts.
fn closest_account(
    input: &GroupInput<'_>,
    domain: &Domain,
    attempt: &Attempt,
) -> (String, Vec<PodAccount>) {
    let placed: Vec<String> = attempt
        .placed
        .iter()
        .map(|(i, d)| {
            format!(
                "{} on {}",
                pod_name(&input.members[*i]),
                decision_node(d).unwrap_or("its node")
            )
        })
        .collect();
    let mut summary = format!(
        "; the closest attempt, in {domain}, placed {} of them ({})",
        attempt.placed.len(),
        placed.join(", ")
    );
    if let Some((i, why)) = attempt.missed.first() {
        summary.push_str(&format!(
            "; {} did not fit there: {why}",
            pod_name(&input.members[*i])
        ));
    }
    let mut pods = Vec::new();
    for (i, d) in &attempt.placed {
        pods.push(PodAccount {
            pod: pod_name(&input.members[*i]),
            node: decision_node(d).map(str::to_owned),
            message: "placed in the closest attempt".into(),
        });
    }
    for (i, why) in &attempt.missed {
        pods.push(PodAccount {
            pod: pod_name(&input.members[*i]),
            node: None,
            message: why.clone(),
        });
    }
    (summary, pods)
}

/// Each member decided alone against the whole cluster, and the first bad input found.
fn alone_accounts(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    now: Timestamp,
) -> (Vec<PodAccount>, Option<String>) {
    let mut pods = Vec::new();
    let mut invalid = None;
    for member in &input.members {
        let decision = crate::view::decide_pod(member.pod, member.claims, context, settings, now);
        let (node, message) = match &decision.action {
            Action::Place(p) => (Some(p.node.clone()), "fits alone".to_owned()),
            Action::Release { node } => (node.clone(), "already allocated".to_owned()),
            Action::Nothing => (None, "nothing to do".to_owned()),
            Action::LeaveToScheduler { message } => (None, message.clone()),
            Action::CannotPlace {
                failure, message, ..
            } => {
                if *failure == Failure::InvalidInput && invalid.is_none() {
                    invalid = Some(format!("{}: {message}", pod_name(member)));
                }
                (None, message.clone())
            }
        };
        pods.push(PodAccount {
            pod: pod_name(member),
            node,
            message,
        });
    }
    (pods, invalid)
}

fn wait_outcome(
    input: &GroupInput<'_>,
    context: &PodContext<'_>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
    closest: Option<(Domain, Attempt)>,
    truncated: bool,
) -> GroupOutcome {
    let needed = input.needed().max(1);
    let mut summary = format!(
        "{} needs {needed} of its {} gated pods placed together (minCount {}, {} placed already)",
        input.key,
        input.members.len(),
        input.min_count,
        input.placed
    );
    let mut pods = Vec::new();
    match &closest {
        Some((domain, attempt)) => {
            let (text, accounts) = closest_account(input, domain, attempt);
            summary.push_str(&text);
            pods = accounts;
        }
        None => summary.push_str("; no pod of the group fits on any eligible node"),
    }
    // Bad input of any member fails the group as such.
    let mut invalid = None;
    if group.accounts || closest.is_none() {
        (pods, invalid) = alone_accounts(input, context, settings, now);
        if closest.is_none()
            && let Some(first) = pods.first()
        {
            summary.push_str(&format!("; {}: {}", first.pod, first.message));
        }
    }
    if truncated {
        summary.push_str("; the search stopped at its budget");
    }
    if let Some(invalid) = invalid {
        return GroupOutcome::Wait {
            failure: Failure::InvalidInput,
            reason: PodReason::InvalidInput,
            message: format!("{}: {invalid}", input.key),
            pods,
        };
    }
    GroupOutcome::Wait {
        failure: Failure::Unsatisfiable,
        reason: PodReason::GroupUnsatisfiable,
        message: summary,
        pods,
    }
}

/// Whether the group could be placed if no device were in use and no pod ran (the cluster as
/// it is, empty): a group that could not is never waited for by others.
pub fn fits_when_free(
    input: &GroupInput<'_>,
    devices: &ClusterSnapshot,
    unmanaged: &dyn Fn() -> std::sync::Arc<DeviceIndex>,
    settings: &Settings,
    group: &GroupSettings,
    now: Timestamp,
) -> bool {
    let empty = AllocatedState::new();
    let usage = HashMap::new();
    let context = PodContext {
        devices,
        unmanaged,
        in_use: &empty,
        usage: &usage,
    };
    matches!(
        decide_group(input, &context, settings, group, now).outcome,
        GroupOutcome::Place { .. }
    )
}

/// A group that waits, as the starvation policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub key: GroupKey,
    /// When its oldest pod was created: its place in line.
    pub arrived: Timestamp,
    /// When it was first found waiting for capacity.
    pub since: Timestamp,
    /// It could be placed on the cluster's devices when free ([`fits_when_free`]).
    pub fits_when_free: bool,
}

/// The group that holds back a pod (or group) that `arrived` at that time: the earliest-arrived
/// group that arrived before it, could run on the free cluster, and has waited at least `hold`.
/// Holding back later arrivals is what guarantees the group runs once the work that arrived
/// before it has freed enough devices; a group that could never run holds back nothing.
pub fn held_back_by<'w>(
    arrived: Timestamp,
    own: Option<&GroupKey>,
    waiting: impl IntoIterator<Item = &'w Waiting>,
    now: Timestamp,
    hold: SignedDuration,
) -> Option<&'w Waiting> {
    waiting
        .into_iter()
        .filter(|w| {
            w.fits_when_free
                && Some(&w.key) != own
                && w.arrived < arrived
                && now.duration_since(w.since) >= hold
        })
        .min_by(|a, b| (a.arrived, &a.key).cmp(&(b.arrived, &b.key)))
}
