//! The start-up recovery gate: whether recovery has finished, and why not yet. Calls hold it
//! shared; a recovery attempt holds it exclusively (see [`super::recovery`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_cdi::SpecDirError;
use tokio::sync::{Notify, watch};

use crate::checkpoint::CheckpointStoreError;
use crate::claims::ClaimSourceError;

/// Where start-up recovery stands. Until it has finished, the driver serves what it can
/// (prepared claims from the checkpoint, unprepare) and refuses new prepares; a task retries
/// it with backoff, at once when a prepare asks for it ([`RecoveryState::attempt_now`]), and
/// `/readyz` says why the node is not ready.
pub(super) struct RecoveryState {
    /// Calls hold it shared; a recovery attempt holds it exclusively.
    pub(super) gate: tokio::sync::RwLock<()>,
    /// `None` once recovered, else why not yet.
    pending: watch::Sender<Option<String>>,
    /// The checkpoint was lost and CDI specs of unknown claims exist: they are rebuilt from
    /// the API server's claims.
    needs_rebuild: AtomicBool,
    /// The checkpoint file does not hold this boot's records yet (missing, quarantined, written
    /// during another boot): the first successful attempt writes it. Otherwise an unchanged
    /// checkpoint is not rewritten (a full state directory must not stop the plugin).
    write_needed: AtomicBool,
    /// Wakes the retrying task for an attempt now (a prepare arrived).
    pub(super) attempt_wanted: Arc<Notify>,
}

impl RecoveryState {
    pub(super) fn new(needs_rebuild: bool, write_needed: bool) -> Self {
        Self {
            gate: tokio::sync::RwLock::new(()),
            pending: watch::channel(Some("recovery has not run yet".to_owned())).0,
            needs_rebuild: AtomicBool::new(needs_rebuild),
            write_needed: AtomicBool::new(write_needed),
            attempt_wanted: Arc::new(Notify::new()),
        }
    }

    /// Why recovery has not finished, if it has not.
    pub(super) fn pending(&self) -> Option<String> {
        self.pending.borrow().clone()
    }

    /// Whether the lost checkpoint still has to be rebuilt.
    pub(super) fn rebuild_pending(&self) -> bool {
        self.needs_rebuild.load(Ordering::Relaxed)
    }

    /// Records why recovery has not finished (`None`: it has).
    pub(super) fn set_pending(&self, why: Option<String>) {
        self.pending.send_replace(why);
    }

    /// Whether the checkpoint file still has to be written for this boot.
    pub(super) fn write_needed(&self) -> bool {
        self.write_needed.load(Ordering::Relaxed)
    }

    /// The checkpoint file now holds this boot's records.
    pub(super) fn written(&self) {
        self.write_needed.store(false, Ordering::Relaxed);
    }

    /// The lost checkpoint has been rebuilt.
    pub(super) fn rebuilt(&self) {
        self.needs_rebuild.store(false, Ordering::Relaxed);
    }

    /// Asks the retrying task for an attempt now and waits (at most `wait`) for its outcome.
    /// Returns at once when recovery has finished.
    pub(super) async fn attempt_now(&self, wait: std::time::Duration) {
        let mut pending = self.subscribe();
        if pending.borrow_and_update().is_none() {
            return;
        }
        self.attempt_wanted.notify_one();
        // The next attempt's outcome (a failed one is recorded too, so this wakes either way).
        let _ = tokio::time::timeout(wait, pending.changed()).await;
    }

    /// Follows [`RecoveryState::pending`].
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.pending.subscribe()
    }
}

/// Why a recovery attempt did not finish.
#[derive(Debug, thiserror::Error)]
pub(super) enum RecoveryError {
    #[error(
        "the checkpoint was lost and CDI specs of prepared claims exist, but the API server \
         cannot tell which claims are still allocated here: {0}"
    )]
    Rebuild(ClaimSourceError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointStoreError),
    #[error("cannot list this driver's CDI specs: {0}")]
    Specs(#[from] SpecDirError),
    #[error("recovery stopped unexpectedly: {0}")]
    Panicked(String),
}
