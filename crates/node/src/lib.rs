//! The Tessera node driver: prepare/unprepare, checkpoint, sharing, MIG, health, slice publisher.

pub mod health;
pub mod metrics;
pub mod publish;
