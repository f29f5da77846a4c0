//! The Tessera node plugin (`tessera-kubelet-plugin`): the daemon around claim preparation.
//!
//! Claim preparation itself is `tessera-prepare` ([`tessera_prepare::NodeDriver`]); this crate
//! gives it what it works on and serves it: the GPUs ([`backend`]: NVML or a mock topology, the
//! NVIDIA driver root, MIG through NVML), claims read from the API server ([`claims`]), MPS
//! daemons in pods of their own ([`mps_pods`]), and the prepared claims' `status.devices`
//! written back ([`claim_status`]). Around it run the slice publisher ([`publish`]), device
//! health ([`health`]), per-device GPU metrics and idle claims ([`gpu_metrics`]), and the
//! plugin's own metrics and readiness ([`metrics`]).
//!
//! [`NodePlugin`] is the composition root `tessera-kubelet-plugin` runs: it opens the backend,
//! starts the driver, serves it to the kubelet, starts the background parts and the HTTP
//! endpoints, and stops them in order.
//!
//! Modules, each using only those above it:
//! - [`claims`]: [`claims::KubeClaimSource`], the driver's claims from the API server.
//! - [`claim_status`]: [`claim_status::StatusWriter`], prepared claims' `status.devices`
//!   written in the background.
//! - [`mps_pods`]: [`mps_pods::PodMpsControl`], MPS control daemons in pods of their own.
//! - [`imex_pods`]: [`imex_pods::PodImexControl`], IMEX daemons in pods of their own, one per
//!   (domain, node), restarted when their domain's peers change.
//! - [`metrics`]: the plugin's metrics ([`metrics::NodeMetrics`]), the instrumented driver and
//!   `/readyz`.
//! - [`gpu_metrics`]: per-device GPU metrics labelled with who holds each device; idle claims.
//! - [`health`]: XID/ECC and lost-GPU findings, the NVML event loop, the kubelet health stream.
//! - [`backend`]: the GPUs and the driver root: [`backend::Backend::open`].
//! - [`publish`]: the slice publisher and its loop over the node's inventory.
//! - [`plugin`]: [`NodePlugin`], the composition root.

pub mod backend;
pub mod claim_status;
pub mod claims;
pub mod gpu_metrics;
pub mod health;
pub mod imex_pods;
pub mod metrics;
pub mod mps_pods;
pub mod plugin;
pub mod publish;

pub use plugin::{NodePlugin, NodePluginConfig, PluginError};
