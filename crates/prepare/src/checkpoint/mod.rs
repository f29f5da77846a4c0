//! The checkpoint: what the driver has prepared (or is preparing or unpreparing) on this node,
//! persisted so that a restart (or a crash at any point) converges instead of leaking devices,
//! CDI specs or MPS daemons. A private file format of this crate: nothing else reads it.
//!
//! - `format`: the versioned, checksummed schema ([`Checkpoint`], [`ClaimRecord`]) with
//!   [`encode`], [`decode`] and [`check_owner`]. No IO.
//! - `store`: the file in the state directory ([`CheckpointStore`]): loaded once at start (a
//!   file that cannot be trusted is quarantined), rewritten atomically on every change.

mod format;
mod store;

pub use format::{
    CHECKPOINT_VERSION, CHECKPOINT_VERSION_1, Checkpoint, CheckpointError, ClaimRecord, ClaimState,
    DeviceRecord, DeviceShare, DeviceTarget, MigInstanceRecord, MigLifecycle, MpsRecord,
    check_owner, checksum, decode, encode,
};
pub use store::{
    CHECKPOINT_FILE, CheckpointOwner, CheckpointStore, CheckpointStoreError, DEFAULT_BOOT_ID_PATH,
    LoadOutcome, quarantined_files, read_boot_id,
};
