//! Tessera's domain types, shared by every other crate: the names Tessera publishes and reacts to,
//! the device attribute schema, the opaque configuration kinds with their strict decoding, and
//! the naming rules of `resource.k8s.io/v1`. No IO.
//!
//! Modules, from the ground up (a module imports only from modules on its line or the lines before):
//! - `names` (every name Tessera publishes or reacts to), `imex` (IMEX channels, their pools and
//!   class, what a domain's containers get), `quantity` (the one Kubernetes quantity
//!   parser), `shares` (consumable-share modes), `validation` (`resource.k8s.io/v1` naming rules);
//! - `config` (our opaque configuration kinds, strictly decoded), `schema` (the device schema);
//! - `nvidia` (NVIDIA's `resource.nvidia.com/v1beta1` configs read as ours, and the decoding that
//!   accepts both).

pub mod config;
pub mod imex;
pub mod names;
pub mod nvidia;
pub mod quantity;
pub mod schema;
pub mod shares;
pub mod validation;

pub use names::DRIVER_NAME;
