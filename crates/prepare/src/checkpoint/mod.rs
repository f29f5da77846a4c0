//! The checkpoint: what the driver has prepared (or is preparing or unpreparing) on this node,
//! persisted so that a restart (or a crash at any point) converges instead of leaking devices,
//! CDI specs or MPS daemons. A private file format of this crate: nothing else reads it.
//!
//! - `format`: the versioned, checksummed schema ([`Checkpoint`], [`ClaimRecord`]) with
//!   [`encode`], [`decode`] and [`check_owner`]. No IO.
//! - `lock`: the node's state lock, which plugin processes sharing the state directory during
//!   a rolling update take turns on ([`HeldState`]).
//! - `store`: the file in the state directory ([`CheckpointStore`]): loaded at start (a file
//!   that cannot be trusted is quarantined), rewritten atomically on every change, read again
//!   when another process replaced it.

mod format;
mod lock;
mod store;

pub use format::{
    CHECKPOINT_VERSION, CHECKPOINT_VERSION_1, Checkpoint, CheckpointError, ClaimRecord, ClaimState,
    DeviceRecord, DeviceShare, DeviceTarget, ImexRecord, MigInstanceRecord, MigLifecycle,
    MpsRecord, check_owner, checksum, decode, encode,
};
pub use lock::{HeldState, STATE_LOCK_FILE, StateLockError, TURNSTILE_FILE};
pub use store::{
    CHECKPOINT_FILE, CheckpointOwner, CheckpointStore, CheckpointStoreError, DEFAULT_BOOT_ID_PATH,
    LoadOutcome, quarantined_files, read_boot_id,
};
