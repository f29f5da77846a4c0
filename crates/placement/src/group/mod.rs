//! Groups (gangs): gated pods that are placed together or not at all, close together across
//! nodes. A function of data like the rest of the crate: [`decide_group`] gives a [`GroupPlan`],
//! which `crate::decide` turns into the controller's decision and `tessera explain --pod` prints.
//!
//! **Membership.** A pod names its group with the upstream field `spec.schedulingGroup.podGroupName`
//! (a `scheduling.k8s.io/v1beta1` PodGroup with a `gang` policy gives `minCount`), or, where the
//! cluster does not serve that API, with the label `gpu.tessera.dev/group` and the annotation
//! `gpu.tessera.dev/group-min-count` (docs/user-guide.md, "Training jobs as gangs").
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
//!
//! Modules, bottom up: [`error`], [`membership`] (who is in a group, `minCount`), [`settings`],
//! [`domains`] (the hierarchy as domains of nodes), [`score`], [`search`] ([`decide_group`]),
//! [`starvation`] ([`held_back_by`], [`fits_when_free`]).

pub mod domains;
pub mod error;
pub mod membership;
pub mod score;
pub mod search;
pub mod settings;
pub mod starvation;

pub use domains::Domain;
pub use error::GroupError;
pub use membership::{
    GroupKey, GroupSource, group_key, label_min_count, member_arrival, pod_group_min_count,
};
pub use score::GroupScore;
pub use search::{
    ALTERNATIVES, GroupInput, GroupOutcome, GroupPlan, Member, PodAccount, decide_group,
};
pub use settings::{
    DEFAULT_GROUP_BUDGET, DEFAULT_GROUP_HOLD, GroupSettings, Hierarchy, ZONE_LABEL,
};
pub use starvation::{Waiting, fits_when_free, held_back_by};
