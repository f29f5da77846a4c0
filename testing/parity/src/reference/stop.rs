//! What ends a walk early: an error upstream reports, or something beyond the reference's reach.
//! Below every other file of the reference.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::Nanos;

/// Why the reference cannot decide an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beyond(pub String);

impl std::fmt::Display for Beyond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "beyond the reference's reach: {}", self.0)
    }
}

impl std::error::Error for Beyond {}

pub fn beyond(reason: &str) -> Beyond {
    Beyond(reason.to_owned())
}

/// A quantity the reference reads, or why not.
pub fn quantity(q: &Quantity) -> Result<Nanos, Beyond> {
    Nanos::of(q).ok_or_else(|| beyond(&format!("the quantity {:?}", q.0)))
}

/// What stops a node's allocation: an error upstream reports (its class), or the reference's
/// own limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeStop {
    Error(&'static str),
    Beyond(Beyond),
}

impl From<Beyond> for NodeStop {
    fn from(b: Beyond) -> NodeStop {
        NodeStop::Beyond(b)
    }
}
