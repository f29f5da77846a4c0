//! What Tessera's two long-running processes — `tessera-kubelet-plugin` and
//! `tessera-controller` — share, so that both behave the same way:
//!
//! - [`client`]: the Kubernetes client from `--kubeconfig` or the in-cluster service account;
//! - [`logging`]: `tracing` to stderr, text or JSON (`--log-format`), filter from `--log-level`
//!   (else `RUST_LOG`);
//! - [`env`]: every flag's variable is `TESSERA_<FLAG>`; older bare names still work, with a
//!   deprecation warning;
//! - [`build`]: the version, git commit and compiler (`--version`, `tessera_build_info`);
//! - [`signal`]: the future that completes on SIGTERM or SIGINT;
//! - [`duration`]: duration flags (`30s`, `5m`, `1h30m`), positive and bounded, never a panic;
//! - [`liveness`]: heartbeats of background loops, which `/healthz` checks;
//! - [`endpoints`]: `/metrics`, `/healthz` and `/readyz`, each probe able to say why it fails;
//! - [`Stop`]: one way to stop every part of a process (a cancellation token).
//!
//! The binaries keep only their flags and their wiring.

pub mod build;
pub mod client;
pub mod duration;
pub mod endpoints;
pub mod env;
pub mod liveness;
pub mod logging;
pub mod signal;

pub use client::{ClientArgs, ClientError, Clients, kube_client, kube_clients};
pub use duration::{DurationError, parse_duration};
pub use endpoints::{EndpointError, EndpointServer, Endpoints, MetricsText, Probe, Reasons};
pub use env::{COMMON_RENAMED, OldEnvName, Renamed};
pub use liveness::{Heartbeat, Liveness};
pub use logging::{LogArgs, LogFormat};
pub use signal::termination;

/// Stops a process's parts: cancel it once, and every loop holding a clone (or a child) ends.
/// Async loops await [`Stop::cancelled`]; blocking threads poll [`Stop::is_cancelled`].
pub type Stop = tokio_util::sync::CancellationToken;

/// Cancels its [`Stop`] when dropped ([`Stop::drop_guard`]).
pub type StopOnDrop = tokio_util::sync::DropGuard;
