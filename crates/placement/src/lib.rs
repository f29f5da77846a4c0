//! The topology-aware controller's decision for a pod, as a function of data: no IO, no `kube`,
//! no `tokio`. `tessera-controller` carries the decisions out; `tessera explain --pod` prints
//! them. Both reach the planner through [`view::decide_pod`], so they cannot disagree.
//!
//! - [`resolve`]: a pod's claims (direct, or generated from a template);
//! - [`pods`]: which pods the controller works on, what is in use (devices, node resources);
//! - [`usage`]: the same in-use state kept current object by object (the controller's watches);
//! - [`nodes`] and [`resources`]: which nodes a pod may run on before devices are looked at;
//! - [`managed`]: which devices are topology-managed (the only ones the controller allocates);
//! - [`claims`]: a pod's claims sorted by who allocated them, the managed-taint toleration;
//! - [`group`]: gangs, placed all or nothing and close together across nodes;
//! - [`extended`]: extended resources backed by DeviceClasses, which only the scheduler allocates;
//! - [`planner`]: the decision ([`planner::decide`]); [`message`]: what the pod is told;
//! - [`view`]: the cluster as a decision reads it and [`view::decide_pod`];
//! - [`objects`]: the same decision over a plain set of API objects;
//! - [`writes`]: the patch bodies that carry a decision out, and the undo plan;
//! - [`protocol`]: the marks the controller leaves on pods and claims (docs/protocol.md);
//! - [`synthetic`]: the GPU node that simulations and benchmarks build their clusters from.

pub mod claims;
pub mod extended;
pub mod group;
pub mod managed;
pub mod message;
pub mod nodes;
pub mod objects;
pub mod planner;
pub mod pods;
pub mod protocol;
pub mod reason;
pub mod resolve;
pub mod resources;
pub mod synthetic;
pub mod usage;
pub mod view;
pub mod writes;

pub use objects::{ClusterObjects, GroupVerdict, PodVerdict};
pub use planner::{Action, Failure, Placement, PodPlan};
pub use reason::{EventKind, PodReason};
pub use view::{ClusterSnapshot, PodContext, Settings, decide_pod};
