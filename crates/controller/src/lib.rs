//! The Tessera topology-aware controller (docs/protocol.md): it allocates the ResourceClaims of pods
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
//! - pure: the decision itself is `tessera-placement`'s (resolve, node filters, managed devices,
//!   claims, planner, messages, patch bodies, the protocol's marks), shared with `tessera explain`;
//!   here: [`queue`], [`trim`], [`slices`] (the encoded slice cache);
//! - IO: [`watch`], [`cluster`], [`api`], [`worker`] (and [`group`]: gangs), [`events`] (published off
//!   the worker's path), [`leader`], [`controller`]; the HTTP endpoints, client,
//!   logging and signals are `tessera-process`'s.

pub mod api;
pub mod cluster;
pub mod controller;
pub mod events;
pub mod group;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod slices;
pub mod trim;
pub mod watch;
pub mod worker;

pub use controller::{Controller, ControllerConfig};
pub use leader::{Leadership, LeaseConfig};
pub use metrics::Metrics;
