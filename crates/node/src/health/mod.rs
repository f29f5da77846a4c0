//! Device health: NVML XID and ECC events, GPUs a rescan finds lost and GPUs that cannot use
//! their NVLink fabric, become device taints on the published slices and `UNHEALTHY` entries on the kubelet's health stream.
//!
//! - [`policy`]: which events taint a device, with which key, value and effect (the table).
//! - [`findings`]: what has been found, and what it means per published device.
//! - [`monitor`]: the loop that waits for events (NVML's event set) and records findings.
//! - [`kubelet`]: hands the health channel to the kubelet plugin next to any driver.
//!
//! The publisher reads the findings on every publish: it adds their taints to the rendered
//! devices and replaces the kubelet health list.

pub mod findings;
pub mod kubelet;
pub mod monitor;
pub mod policy;

pub use findings::{FabricStates, HealthFindings, HealthScope};
pub use kubelet::WithDeviceHealth;
pub use monitor::{HealthEventSource, HealthMonitor, SharedFindings};
pub use policy::{HealthFinding, TaintEffect, classify, fabric, unreachable};
