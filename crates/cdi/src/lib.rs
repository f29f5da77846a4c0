//! CDI (Container Device Interface) specs for a DRA driver: the spec model as plain serde
//! types, CDI naming rules, and a spec directory with atomic writes.
//!
//! A DRA driver writes one transient spec per prepared claim and returns the qualified device
//! ids to the kubelet; the container runtime resolves them in its CDI spec directories:
//!
//! ```no_run
//! use tessera_cdi::{ContainerEdits, Device, DeviceNode, Kind, Spec, SpecDir};
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let kind = Kind::new("gpu.tessera.dev", "claim")?;
//! let claim_uid = "0b8e7c1a-3c5e-4d0e-9a57-3c1f4a2b9d10";
//! let device_name = format!("{claim_uid}-gpu-0");
//! let spec = Spec::new(kind.clone(), vec![Device {
//!     name: device_name.clone(),
//!     container_edits: ContainerEdits {
//!         env: vec!["NVIDIA_VISIBLE_DEVICES=GPU-6f3e0b4e".into()],
//!         device_nodes: vec![DeviceNode { path: "/dev/nvidia0".into(), ..Default::default() }],
//!         ..Default::default()
//!     },
//! }]);
//! let specs = SpecDir::new("/var/run/cdi", kind.clone());
//! specs.write(claim_uid, &spec)?;                            // gpu.tessera.dev-claim_<uid>.json
//! let cdi_id = kind.device_id(&device_name)?.to_string(); // gpu.tessera.dev/claim=<uid>-gpu-0
//! specs.remove(claim_uid)?;                                 // at unprepare
//! # Ok(()) }
//! ```
//!
//! Every spec declares the lowest `cdiVersion` that expresses it ([`Spec::new`],
//! [`Spec::set_minimum_version`]), because a runtime rejects versions newer than its CDI
//! library: containerd 1.7 reads up to 0.5.0, containerd 2.1 up to 1.0.0. Tessera's claim
//! specs (device nodes with `hostPath`, device names that start with a claim UID) need 0.5.0.
//!
//! Device names must be unique across all specs of a kind (the runtime drops conflicting
//! devices), so a per-claim spec puts the claim UID into each device name.
//!
//! This crate does file IO only: no network, no async runtime.
//!
//! Modules: `names` (CDI's naming rules and qualified device ids), `spec` (the spec model and its
//! minimum version), `dir` (`SpecDir`: atomic writes, batches, reads, removal, listing).

mod dir;
mod names;
mod spec;

pub use dir::{
    BatchOperation, SPEC_DIR_MODE, SPEC_FILE_MODE, SpecBatchError, SpecDir, SpecDirError,
};
pub use names::{Kind, NameError, QualifiedDevice, validate_device_name};
pub use spec::{
    CdiVersion, ContainerEdits, Device, DeviceNode, DeviceNodeType, Hook, HookName, Mount, Spec,
    SpecError, UnknownVersion,
};
