//! A pure model of a cluster and of the controller acting on it, for what must be checked over
//! many steps rather than one decision: the property tests of preemption (no device allocated
//! twice, no gang split, no victim of equal or higher priority, budgets respected, every
//! preemption completed or released), `tessera simulate --tenants`, and the benches.
//!
//! [`ClusterModel`] changes API objects as the API server, the kubelet and the resourceclaim
//! controller would; [`ControllerModel`] makes the controller's decisions on them each step.

mod cluster;
mod controller;

pub use cluster::{
    BudgetTemplate, ClusterModel, ModelError, NAMESPACE, PodTemplate, Refusal, is_running,
};
pub use controller::{ControllerModel, Event, Evictor, gangs};
