//! The Tessera topology-aware controller (design.md §4): it allocates the ResourceClaims of pods
//! carrying the scheduling gate `gpu.tessera.dev/topology-aware` on the best-connected
//! topology-managed devices, then removes the gate so the scheduler binds the pod.
//!
//! Pure core, thin shell:
//!
//! ```text
//! watch ─► cluster (caches, assumed writes, inventory) ─► worker ─► planner (pure) ─► api (writes)
//!                                   ▲                        │
//!                                 queue ◄────────────────────┘      leader (Lease) gates every write
//! ```
//!
//! - pure: [`resolve`] (a pod's claims), [`nodes`] and [`resources`] (node filters),
//!   [`inventory`] (managed devices), [`claims`], [`planner`] (the decision), [`message`],
//!   [`writes`] (patch bodies, the undo plan), [`queue`], [`protocol`] (the marks it leaves),
//!   [`trim`], [`slices`] (the encoded slice cache);
//! - IO: [`watch`], [`cluster`], [`api`], [`worker`], [`leader`], [`controller`]; the HTTP endpoints, client,
//!   logging and signals are `tessera-runtime`'s.

pub mod api;
pub mod claims;
pub mod cluster;
pub mod controller;
pub mod inventory;
pub mod leader;
pub mod message;
pub mod metrics;
pub mod nodes;
pub mod planner;
pub mod protocol;
pub mod queue;
pub mod resolve;
pub mod resources;
pub mod slices;
pub mod trim;
pub mod watch;
pub mod worker;
pub mod writes;

pub use controller::{Controller, ControllerConfig};
pub use leader::{Leadership, LeaseConfig};
pub use metrics::Metrics;
