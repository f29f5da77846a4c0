//! The NVIDIA driver's files as a container sees them.
//!
//! - [`ldcache`]: the glibc loader cache format, read and written.
//! - [`tree`]: a read-only view of a directory tree whose symlinks are followed inside it.
//! - [`discover`]: which of the driver's files (libraries, binaries, firmware, sockets) under a
//!   driver root a container needs.
//! - [`edits`]: the CDI container edits that inject them.
//! - [`hook`]: `tessera-cdi-hook`, which adds them to a container's loader cache.
//! - [`devices`]: the driver's device nodes and the MIG capability minors.

pub mod devices;
pub mod discover;
pub mod edits;
pub mod hook;
pub mod ldcache;
pub mod tree;
