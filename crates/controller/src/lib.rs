//! The Tessera topology-aware controller (docs/protocol.md): it allocates the ResourceClaims of pods
//! carrying the scheduling gate `gpu.tessera.dev/topology-aware` on the best-connected
//! topology-managed devices, then removes the gate so the scheduler binds the pod.
//!
//! Decide, then do: the worker hands the caches to `tessera_placement::decide::decide`, which
//! returns the pod's (or its group's) `Decision` — pure data, the same `tessera explain` prints —
//! and [`execute`] carries it out.
//!
//! ```text
//! watch ─► cluster (caches, assumed writes, inventory) ─► worker ─► decide (pure) ─► Decision
//!                                   ▲                                                  │
//!                                 queue ◄──── execute (writes with undo, via api) ◄────┘
//!                                                 leader (Lease) gates every write
//! ```
//!
//! Modules, bottom up:
//! - [`slices`]: the ResourceSlices kept JSON-encoded (pure);
//! - [`trim`]: what the caches keep of each object (pure);
//! - [`queue`]: the work queue, backoff and parking (pure);
//! - [`metrics`]: the controller's Prometheus metrics; [`timing`]: the timing events;
//! - [`leader`]: Lease leader election; every write checks it;
//! - [`api`]: every write the controller sends, checked against leadership and bounded in time;
//! - [`events`]: pod events, published by a task of their own off the worker's path;
//! - [`cluster`]: the caches, the objects written and not yet seen back, what the cluster uses,
//!   the device inventory;
//! - [`watch`]: the watches that fill the caches and wake the queue;
//! - [`channels`]: the IMEX channels of every fabric clique, published while leading;
//! - [`waiting`]: the groups waiting for capacity (the starvation policy's memory);
//! - [`refusals`]: evictions refused recently, left out of preemption searches a while;
//! - [`execute`]: carrying a decision out, step by step, with undo;
//! - [`worker`]: one pod: decide, then execute;
//! - [`webhook`]: the admission webhook every replica serves (certificates in a Secret, the
//!   webhook configuration's `caBundle`, the device-plugin conversion);
//! - [`controller`]: the composition root, started and stopped in order; the HTTP endpoints,
//!   client, logging and signals are `tessera-process`'s.

pub mod api;
pub mod channels;
pub mod cluster;
pub mod controller;
pub mod events;
pub mod execute;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod refusals;
pub mod slices;
pub mod timing;
pub mod trim;
pub mod waiting;
pub mod watch;
pub mod webhook;
pub mod worker;

pub use controller::{Controller, ControllerConfig};
pub use leader::{Leadership, LeaseConfig};
pub use metrics::Metrics;
pub use webhook::WebhookConfig;
