//! How group decisions are made: the hierarchy of topology domains, the search's budget, how long
//! a group waits before it holds back later arrivals.

use k8s_openapi::jiff::SignedDuration;
use tessera_api::names::{BLOCK_LABEL, RACK_LABEL};

use crate::group::error::GroupError;

/// Default step budget of a group decision: pod decisions, each over one domain's nodes.
pub const DEFAULT_GROUP_BUDGET: usize = 4096;

/// Default time a group waits for capacity before it holds back later arrivals.
pub const DEFAULT_GROUP_HOLD: SignedDuration = SignedDuration::from_secs(60);

/// The zone label (Kubernetes' well-known label), the coarsest default level.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

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
