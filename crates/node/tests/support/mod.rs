//! Shared by the integration tests.
#![allow(dead_code)]

pub mod node_state;
pub mod process;
