//! Stand-ins for the IMEX daemon `nvidia-imex` and its query tool `nvidia-imex-ctl`, the two
//! programs of NVIDIA's IMEX package that Tessera runs (README.md, "What the stand-ins do").
//!
//! The daemon reads the keys of the real `config.cfg` that matter to Tessera, finds its own
//! address among those of its nodes config (`BIND_INTERFACE_IP`, or the first one it can listen
//! on), listens there for its peers (`SERVER_PORT`) and asks every other node twice a second
//! whether their address maps agree (as real daemons refuse peers whose maps differ). One daemon
//! per node: a second one, on the same fake driver, is refused (the real driver admits one
//! process to its fabric management). Its state — `READY`, or `NOT_READY`/`UNAVAILABLE` while the
//! test's knobs (`<dev root>/tessera-fake-gpu-state/imex.json`) say so — is answered on its command
//! service (`IMEX_CMD_UNIX_DOMAIN_PATH` and/or `IMEX_CMD_PORT`).
//!
//! Bottom up: [`config`] (config files and knobs), [`protocol`] (what the two programs exchange),
//! [`daemon`], [`ctl`].

pub mod config;
pub mod ctl;
pub mod daemon;
pub mod protocol;
