//! The NVIDIA driver's files as a container sees them.
//!
//! - [`ldcache`]: the glibc loader cache format, read and written.
//! - [`devices`]: the driver's device nodes and the MIG capability minors.

pub mod devices;
pub mod ldcache;
