//! Kubelet-facing plumbing for a DRA driver: plugin registration, the DRA services
//! (`v1.DRAPlugin`, `v1beta1.DRAPlugin`) and the device health stream
//! (`v1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth`) on unix sockets.
//!
//! A driver implements [`DraDriver`] in domain types; this crate does the gRPC, the socket
//! handling and the checks on what the kubelet sends. It knows nothing of Kubernetes objects
//! (no `kube` dependency): reading claims from the API server is the driver's business.
//!
//! ```no_run
//! # use std::{collections::BTreeMap, sync::Arc};
//! # use tessera_kubelet_grpc::*;
//! struct Driver;
//!
//! impl DraDriver for Driver {
//!     type Error = String;
//!     async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult> {
//!         claims.into_iter().map(|claim| (claim.uid, Ok(Vec::new()))).collect()
//!     }
//!     async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, UnprepareResult> {
//!         claims.into_iter().map(|claim| (claim.uid, Ok(()))).collect()
//!     }
//! }
//!
//! # async fn run() -> Result<(), ServeError> {
//! let plugin = PluginConfig::new("gpu.tessera.dev").bind(Arc::new(Driver))?;
//! let ready = plugin.registration_state(); // RegistrationState::Registered once the kubelet agrees
//! plugin.serve(async { tokio::signal::ctrl_c().await.ok(); }).await
//! # }
//! ```
//!
//! [`simulator::KubeletSimulator`] is the kubelet's side of the conversation, for tests.
//!
//! Modules, from the ground up (a module imports only from modules on its line or the lines before):
//! - `proto` (the generated protocols), `authority` (the registration `:authority` rewrite),
//!   `driver` (the [`DraDriver`] trait and its types), `socket` (socket paths and binding), `stop`;
//! - the services: `dra_service`, `health`, `registration`;
//! - `server` ([`PluginConfig`], [`KubeletPlugin`]), `simulator`.

pub mod authority;
mod dra_service;
mod driver;
mod health;
pub mod proto;
mod registration;
mod server;
pub mod simulator;
mod socket;
mod stop;

pub use dra_service::{MAX_CLAIM_ERROR_BYTES, bounded};
pub use driver::{
    ClaimRef, ClaimUid, DeviceHealth, DraDriver, HealthStatus, PrepareResult, PreparedDevice,
    UnprepareResult,
};
pub use registration::{
    DRA_PLUGIN_V1, DRA_PLUGIN_V1BETA1, DRA_RESOURCE_HEALTH_V1, DRA_RESOURCE_HEALTH_V1ALPHA1,
    PLUGIN_TYPE_DRA, RegistrationState,
};
pub use server::{DEFAULT_SHUTDOWN_GRACE, KubeletPlugin, PluginConfig, ServeError};
pub use socket::{
    DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR, DEFAULT_SOCKET_MODE, MAX_SOCKET_PATH_BYTES,
    SOCKET_DIR_MODE, SocketError, SocketPaths,
};
