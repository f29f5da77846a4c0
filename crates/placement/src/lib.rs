//! The topology-aware controller's decision for a pod, as a function of data: no IO, no `kube`,
//! no `tokio`. [`decide::decide`] is the one entry point: it returns a [`Decision`] — the claim
//! writes, the pod patches, the conditions and events, in order, and the ruling — which
//! `tessera-controller` carries out and `tessera explain --pod` prints, so they cannot disagree.
//!
//! Modules, bottom up:
//! - [`reason`]: why a pod is (not) placed ([`PodReason`]), shared by conditions, events, metrics;
//! - [`protocol`]: the marks the controller leaves on pods and claims (docs/protocol.md);
//! - [`resolve`]: a pod's claims (direct, or generated from a template);
//! - [`resources`]: node resources (cpu, memory, pods) requested and allocatable;
//! - [`pods`]: which pods the controller works on, what is in use (devices, node resources);
//! - [`usage`]: the same in-use state kept current object by object (the controller's watches);
//! - [`nodes`]: which nodes a pod may run on before devices are looked at;
//! - [`managed`]: which devices are topology-managed (the only ones the controller allocates);
//! - [`claims`]: a pod's claims sorted by who allocated them, the managed-taint toleration;
//! - [`imex`]: IMEX domains (claims of the channel class), their cliques and channels in use;
//! - [`extended`]: extended resources backed by DeviceClasses, which only the scheduler allocates;
//! - [`message`]: what the pod is told when it does not fit;
//! - [`writes`]: the patch bodies that carry a decision out, and the undo plan;
//! - [`planner`]: one pod's plan ([`planner::decide`], [`PodPlan`]);
//! - [`view`]: the cluster as a decision reads it, and [`view::decide_pod`] (filters + planner);
//! - [`group`]: gangs, placed all or nothing and close together across nodes ([`group::GroupPlan`]);
//! - [`decision`]: the decision as data ([`Decision`], its steps and verdict) and what it reads
//!   ([`ClusterSource`]);
//! - [`decide`]: the entry point, a pod alone or with its group;
//! - [`objects`]: the same decision over a plain set of API objects (explain);
//! - [`synthetic`]: the GPU node that simulations and benchmarks build their clusters from.
//! - [`preemption`]: which running pods of lower priority to evict so a pod or gang fits, the
//!   devices nominated for it meanwhile;
//! - [`simulation`]: the controller's decisions and preemptions run against a cluster model over
//!   many steps (the property test over random traces).

pub mod claims;
pub mod decide;
pub mod decision;
pub mod extended;
pub mod group;
pub mod imex;
pub mod managed;
pub mod message;
pub mod nodes;
pub mod objects;
pub mod planner;
pub mod pods;
pub mod preemption;
pub mod protocol;
pub mod reason;
pub mod resolve;
pub mod resources;
pub mod simulation;
pub mod synthetic;
pub mod usage;
pub mod view;
pub mod writes;

pub use decision::{ClusterSource, Decision, GroupVerdict, PodVerdict, Ruling};
pub use objects::ClusterObjects;
pub use planner::{Action, Failure, Placement, PodPlan};
pub use reason::{EventKind, PodReason};
pub use view::{ClusterSnapshot, PodContext, Settings, decide_pod};
