//! Test-only NVML: a cdylib exporting the subset of the NVML C ABI Tessera calls, answering from a
//! topology file. Loading `libtessera_fake_nvml.so` in place of `libnvidia-ml.so.1` runs the real
//! NVML code path of `tessera_nvml` (nvml-wrapper included) without a GPU.
//!
//! - `TESSERA_FAKE_NVML_TOPOLOGY` ([`TOPOLOGY_ENV`]): the topology the GPUs come from — a YAML
//!   topology file (docs/topology-format.md, parsed by `tessera_gpu_inventory`'s own parser) or the
//!   name of a shipped topology. Read at the first `nvmlInit_v2`; without it `nvmlInit_v2` fails
//!   with `NVML_ERROR_DRIVER_NOT_LOADED` and says why on stderr.
//! - `TESSERA_FAKE_NVML_EVENTS` ([`EVENTS_ENV`]): optional path of the event injection file
//!   (format in [`events`]).
//! - `TESSERA_FAKE_NVML_SAMPLES` ([`SAMPLES_ENV`]): optional path of the samples file that scripts
//!   utilization, memory in use, power, temperature and ECC counts (format in [`samples`]);
//!   without it, `samples` in the state directory.
//! - `TESSERA_FAKE_NVML_LOST_GPUS` ([`LOST_GPUS_ENV`]): optional comma-separated GPU UUIDs that
//!   "fell off the bus": every query on them except `nvmlDeviceGetUUID` answers
//!   `NVML_ERROR_GPU_IS_LOST`.
//!
//! - Embedded driver data ([`embedded`]): a copy of the library patched by the fake driver root
//!   tool answers from the node's topology it carries, for the GPUs whose device nodes it sees.
//!
//! State (including MIG instances created and destroyed through the API) lives for the process,
//! like the hardware's; `nvmlShutdown` ends a session but does not reset it. See README.md for
//! the exported symbols.
//!
//! Modules: `status` (NVML's return codes), `sysfs` (the sysfs tree a fake node needs), `handles`
//! (opaque device handles), `embedded`, `events`, `samples`, `driver` (the process-wide fake GPUs
//! and their state), `exports` (the C functions, grouped as NVML's headers group them).

mod driver;
pub mod embedded;
pub mod events;
mod exports;
mod handles;
pub mod samples;
mod status;
pub mod sysfs;

/// Environment variable naming the topology file (or shipped topology) the fake answers from.
pub const TOPOLOGY_ENV: &str = "TESSERA_FAKE_NVML_TOPOLOGY";
/// Environment variable naming the event injection file.
pub const EVENTS_ENV: &str = "TESSERA_FAKE_NVML_EVENTS";
/// Environment variable naming a directory that keeps settings across processes (time slices),
/// as the kernel driver would; without it they last for the process. (With embedded driver data
/// they are kept under the stand-in device root.)
pub const STATE_DIR_ENV: &str = "TESSERA_FAKE_NVML_STATE_DIR";
/// Environment variable naming the samples file: scripted utilization, memory in use, power,
/// temperature and ECC counts ([`samples`]). Without it, `samples` in the state directory.
pub const SAMPLES_ENV: &str = "TESSERA_FAKE_NVML_SAMPLES";
/// The samples file's name in the state directory (a fake driver root's:
/// `<dev root>/tessera-fake-gpu-state/samples`).
pub const SAMPLES_FILE: &str = "samples";
/// Environment variable listing GPUs (UUIDs, comma-separated) whose queries fail as lost.
pub const LOST_GPUS_ENV: &str = "TESSERA_FAKE_NVML_LOST_GPUS";
/// File name of the built library (in the target directory next to `deps/`).
pub const LIBRARY_FILE_NAME: &str = "libtessera_fake_nvml.so";
