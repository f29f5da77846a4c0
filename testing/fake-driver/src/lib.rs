//! A fake NVIDIA driver for mock nodes: everything a real driver root and `/dev` give a node
//! plugin and a GPU container, standing in for the real files so the same discovery, CDI specs
//! and container checks run without a GPU. Test-only. See README.md for the layout and how to
//! use it.
//!
//! - [`layout`]: the driver root (libraries with sonames and links, loader cache, binaries,
//!   firmware) and the device root (stand-in character devices) of one node.
//! - [`smi`]: the `nvidia-smi` stand-in.
//! - [`mps`]: the `nvidia-cuda-mps-control` / `-server` stand-ins.
//! - [`imex`]: the `nvidia-imex` / `nvidia-imex-ctl` stand-ins (nodes with NVLink fabric).
//! - [`stub`]: writing sonames into the copies of the fake libraries.
//! - [`tool`]: the multi-call binary's dispatch (`tessera-fake-driver-tool`, copied into a
//!   driver root under each binary's name).

pub mod imex;
pub mod layout;
pub mod mps;
pub mod smi;
pub mod stub;
pub mod tool;
