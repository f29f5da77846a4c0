//! Claim preparation on a node: what `NodePrepareResources` and `NodeUnprepareResources` do.
//!
//! [`NodeDriver`] is a [`tessera_kubelet_grpc::DraDriver`]: per batch of claims it reads each claim
//! (a [`claims::ClaimSource`]), plans it ([`plan`], pure), records its intent in the
//! [`checkpoint`], applies MIG and sharing ([`mig::MigControl`], [`sharing::GpuControl`]) and
//! writes its CDI spec ([`cdi_spec`]); how that is ordered, and why a crash at any point
//! converges, is documented in [`driver`] (the crash-point table). The crate knows no API server
//! and serves no socket: the node plugin (`tessera-node`) implements the traits with the API
//! server, NVML and the driver's tools, and serves the driver to the kubelet.
//!
//! Wiring the driver on a mock node, as `tessera-node`'s backend does (it reads claims from the
//! API server instead):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use tessera_prepare::{DriverParts, NodeDriver, NodeDriverConfig};
//! # use tessera_prepare::{claims::InMemoryClaims, inventory::NodeInventory, mig::SimulatedMig};
//! # use tessera_prepare::{plan::MigMode, sharing::SimulatedGpuControl};
//! # use tessera_gpu_inventory::{DeviceSource, MockSource};
//! # async fn wire() -> Result<(), Box<dyn std::error::Error>> {
//! let state_dir = std::path::PathBuf::from("/var/lib/tessera");
//! let config = NodeDriverConfig::new("node-a", "/var/run/cdi", &state_dir)
//!     .mig_mode(MigMode::Dynamic);
//! // No GPUs: sharing and MIG are simulated in files under the state directory (they outlive
//! // the process like the real state; crash tests read them).
//! let mock = MockSource::new("hgx-a100-mig")?;
//! let inventory = mock.inventory()?;
//! let parts = DriverParts {
//!     // The node's inventory, shared with the node plugin's slice publisher.
//!     inventory: Arc::new(NodeInventory::read(Arc::new(mock))?),
//!     claims: Arc::new(InMemoryClaims::new()),
//!     gpu: Arc::new(SimulatedGpuControl::new(state_dir.join("simulated-gpu"))),
//!     mig: Arc::new(SimulatedMig::persistent(&inventory, state_dir.join("simulated-mig.json"))),
//!     // No IMEX daemons here: IMEX channel claims fail with a reason.
//!     imex: Arc::new(tessera_prepare::imex::NoImex),
//! };
//! let (driver, report) = NodeDriver::start(config, parts).await?;
//! // driver.stats().checkpoint_quarantines etc. are counters for /metrics.
//! # Ok(()) }
//! ```
//!
//! Modules, each using only those above it:
//! - [`crash`]: named crash points a process test stops the plugin binary at.
//! - [`paths`]: the one way a claim UID becomes part of a path; directory and file modes.
//! - [`checkpoint`]: the checkpoint's versioned, checksummed format and its file.
//! - [`inventory`]: the node's GPUs as last read ([`inventory::NodeInventory`]), lost GPUs kept.
//! - [`injection`]: what every claim spec injects of the NVIDIA driver.
//! - [`mig`]: MIG instances: the [`mig::MigControl`] trait, capability minors, simulated MIG.
//! - [`sharing`]: time slicing and MPS: the [`sharing::GpuControl`] trait and its controls.
//! - [`imex`]: IMEX domains: the [`imex::ImexControl`] trait (a domain's daemon on this node).
//! - [`cdi_spec`]: a prepared claim's CDI spec (pure).
//! - [`plan`]: a ResourceClaim to the record to prepare (pure).
//! - [`claims`]: where claims are read ([`claims::ClaimSource`]), claims in memory.
//! - [`device_status`]: a prepared claim's `status.devices` entries, and where they go.
//! - [`driver`]: [`NodeDriver`]: prepare, unprepare, recovery at start; the crash-point table.

pub mod cdi_spec;
pub mod checkpoint;
pub mod claims;
pub mod crash;
pub mod device_status;
pub mod driver;
pub mod imex;
pub mod injection;
pub mod inventory;
pub mod mig;
pub mod paths;
pub mod plan;
pub mod sharing;

pub use driver::{
    ClaimError, ClaimFailure, DriverParts, DriverStats, HeldDevice, NodeDriver, NodeDriverConfig,
    StartError, StartupReport,
};
