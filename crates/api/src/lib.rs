//! Tessera's domain types, shared by every other crate: the names Tessera publishes and reacts to,
//! the device attribute schema, the opaque configuration kinds with their strict decoding, and
//! the naming rules of `resource.k8s.io/v1`. No IO.

pub mod config;
pub mod names;
pub mod nvidia;
pub mod quantity;
pub mod schema;
pub mod shares;
pub mod validation;

pub use names::DRIVER_NAME;
