//! The Tessera node driver: prepare/unprepare, checkpoint, sharing, MIG, health, slice publisher.
//!
//! Claim preparation is [`NodeDriver`] (a [`tessera_kubelet_grpc::DraDriver`]); how prepare is
//! ordered and why a crash at any point converges is documented in [`driver`]. Its pure core is
//! [`plan`] (claim → devices and configs) and [`cdi_spec`] (prepared claim → CDI spec); its side
//! effects go through [`sharing::GpuControl`], [`mig::MigControl`] and the [`checkpoint`].
//!
//! [`NodePlugin`] is the composition root `tessera-kubelet-plugin` runs: the driver served to
//! the kubelet, the slice publisher, health monitoring and the HTTP endpoints, stopped in order.
//!
//! Wiring the driver (what [`NodePlugin::start`] does):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use tessera_node::{DriverParts, NodeDriver, NodeDriverConfig};
//! # use tessera_node::{claims::KubeClaimSource, mig::SimulatedMig, plan::MigMode};
//! # use tessera_node::sharing::{SimulatedGpuControl, SystemGpuControl};
//! # use tessera_node::inventory::NodeInventory;
//! # use tessera_gpu_inventory::{DeviceSource, MockSource}; use tessera_nvml::NvmlSource;
//! # use tessera_node::backend::NvmlMig;
//! # async fn wire(client: kube::Client, dynamic_mig: bool) -> Result<(), Box<dyn std::error::Error>> {
//! let state_dir = std::path::PathBuf::from("/var/lib/tessera");
//! let config = NodeDriverConfig::new("node-a", "/var/run/cdi", &state_dir)
//!     .mig_mode(if dynamic_mig { MigMode::Dynamic } else { MigMode::Static });
//! let claims = Arc::new(KubeClaimSource::new(client));
//! // NVML backend: real sharing tools, NVML for MIG.
//! let nvml = Arc::new(NvmlSource::open(None)?);
//! // The node's inventory is shared with the slice publisher (`publish::runner::PublishLoop`).
//! let parts = DriverParts { inventory: Arc::new(NodeInventory::read(nvml.clone())?),
//!     claims: claims.clone(),
//!     gpu: Arc::new(SystemGpuControl::default()), mig: Arc::new(NvmlMig(nvml)) };
//! // Mock backend (--topology): no GPUs, so sharing and MIG are simulated in files under the
//! // state directory (they outlive the process like the real state; crash tests read them).
//! let mock = MockSource::new("hgx-a100-mig")?;
//! let inventory = mock.inventory()?;
//! let parts = DriverParts { inventory: Arc::new(NodeInventory::read(Arc::new(mock))?), claims,
//!     gpu: Arc::new(SimulatedGpuControl::new(state_dir.join("simulated-gpu"))),
//!     mig: Arc::new(SimulatedMig::persistent(&inventory, state_dir.join("simulated-mig.json"))) };
//! let (driver, report) = NodeDriver::start(config, parts).await?;
//! // driver.stats().checkpoint_quarantines etc. are counters for /metrics.
//! # Ok(()) }
//! ```

pub mod backend;
pub mod cdi_spec;
pub mod checkpoint;
pub mod claim_source;
pub mod claim_status;
pub mod claims;
pub mod crash;
pub mod device_status;
pub mod driver;
pub mod gpu_metrics;
pub mod health;
pub mod injection;
pub mod inventory;
pub mod metrics;
pub mod mig;
pub mod paths;
pub mod plan;
pub mod plugin;
pub mod publish;
pub mod sharing;

pub use driver::{
    ClaimError, ClaimFailure, DriverParts, DriverStats, HeldDevice, NodeDriver, NodeDriverConfig,
    StartError, StartupReport,
};
pub use plugin::{NodePlugin, NodePluginConfig, PluginError};
