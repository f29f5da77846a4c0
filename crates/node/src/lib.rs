//! The Tessera node driver: prepare/unprepare, checkpoint, sharing, MIG, health, slice publisher.

pub mod cdi_spec;
pub mod checkpoint;
pub mod claims;
pub mod driver;
pub mod health;
pub mod metrics;
pub mod mig;
pub mod plan;
pub mod publish;
pub mod sharing;

pub use driver::{
    DriverParts, DriverStats, NodeDriver, NodeDriverConfig, StartError, StartupReport,
};
