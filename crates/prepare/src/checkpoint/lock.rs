//! The node's state lock: one plugin process at a time changes the node's claim state (the
//! checkpoint, CDI specs, MPS directories, MIG instances, sharing settings).
//!
//! During a rolling update two plugin processes run on a node and share the state directory
//! and the CDI directory; the kubelet may send a claim's prepare to one and its unprepare to
//! the other. The driver holds this lock ([`super::CheckpointStore::hold`]) around each batch
//! of a call and each recovery attempt; the first holder of a process reads the checkpoint
//! again if the other process replaced it. Within a process the lock is shared: the batches of
//! one process run side by side as before (the driver's per-claim locks and admission lock
//! order them), so a slow claim still holds up no unrelated one.
//!
//! Across processes it is `flock(2)` on `<state dir>/prepare.lock`, held from the first holder
//! of a process to the last. A second file, `prepare.turnstile`, is locked only while waiting
//! for the first: a process that waits for the state lock holds the turnstile, so the other
//! process admits no new holders until it has had its turn (without it, a process whose batches
//! overlap could keep the lock forever). The kernel releases both when a process dies.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The lock file in the state directory.
pub const STATE_LOCK_FILE: &str = "prepare.lock";
/// The file a process waiting for the state lock holds (see the module docs).
pub const TURNSTILE_FILE: &str = "prepare.turnstile";

/// The state lock could not be taken.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot lock {} (the node's claim state, shared by the plugin processes): {source}",
    path.display()
)]
pub struct StateLockError {
    path: PathBuf,
    source: io::Error,
}

/// The node's state lock (see the module docs).
#[derive(Debug)]
pub(super) struct StateLock {
    main: PathBuf,
    turnstile: PathBuf,
    /// The locked file and how many holders of this process share it.
    held: Mutex<Option<(File, usize)>>,
}

/// A holder's share of the state lock; the last one of the process unlocks it.
#[derive(Debug)]
#[must_use = "the state lock is released when this is dropped"]
pub struct HeldState {
    lock: Arc<StateLock>,
}

impl StateLock {
    /// The state lock of `state_dir` (which must exist).
    pub(super) fn new(state_dir: &Path) -> Arc<Self> {
        Arc::new(StateLock {
            main: state_dir.join(STATE_LOCK_FILE),
            turnstile: state_dir.join(TURNSTILE_FILE),
            held: Mutex::new(None),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<(File, usize)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds the lock (blocking: call it off the async runtime). When this process did not
    /// hold it yet, `acquired` runs once it is locked and before any other holder of this
    /// process gets its share (the checkpoint is read again there); its error releases the
    /// lock. Never call it while holding a share: waiting at the turnstile with a share in
    /// hand could wait for a process that waits for that share.
    pub(super) fn hold<E: From<StateLockError>>(
        self: &Arc<Self>,
        acquired: impl FnOnce() -> Result<(), E>,
    ) -> Result<HeldState, E> {
        let turnstile = locked(&self.turnstile)?;
        let mut held = self.held();
        if let Some((_, holders)) = held.as_mut() {
            *holders += 1;
        } else {
            let file = locked(&self.main)?;
            acquired()?;
            *held = Some((file, 1));
        }
        drop(held);
        drop(turnstile);
        Ok(HeldState {
            lock: Arc::clone(self),
        })
    }

    /// Whether this process holds the lock now (for tests).
    #[cfg(test)]
    fn holders(&self) -> usize {
        self.held().as_ref().map_or(0, |(_, holders)| *holders)
    }
}

impl Drop for HeldState {
    fn drop(&mut self) {
        let mut held = self.lock.held();
        if let Some((_, holders)) = held.as_mut() {
            *holders -= 1;
            if *holders == 0 {
                // Closing the file releases the lock.
                *held = None;
            }
        }
    }
}

/// Opens (creating) `path` and locks it exclusively, waiting as long as it takes.
fn locked(path: &Path) -> Result<File, StateLockError> {
    let failed = |source| StateLockError {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::paths::PRIVATE_FILE_MODE)
        .open(path)
        .map_err(failed)?;
    file.lock().map_err(failed)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::*;

    fn hold(lock: &Arc<StateLock>) -> HeldState {
        lock.hold(|| Ok::<(), StateLockError>(())).unwrap()
    }

    #[test]
    fn holders_of_one_process_share_it_and_the_first_reads_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let lock = StateLock::new(dir.path());
        let reads = AtomicUsize::new(0);
        let read = || {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok::<(), StateLockError>(())
        };
        let first = lock.hold(read).unwrap();
        let second = lock.hold(read).unwrap();
        assert_eq!((lock.holders(), reads.load(Ordering::SeqCst)), (2, 1));
        drop(first);
        drop(second);
        assert_eq!(lock.holders(), 0);
        let _again = lock.hold(read).unwrap();
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "read again after a release"
        );
    }

    #[test]
    fn a_failed_read_releases_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = StateLock::new(dir.path());
        let failed = lock.hold(|| {
            Err(StateLockError {
                path: "x".into(),
                source: io::Error::other("unreadable"),
            })
        });
        assert!(failed.is_err());
        assert_eq!(lock.holders(), 0);
        let other = StateLock::new(dir.path());
        let _held = hold(&other);
    }

    /// Two `StateLock`s on one directory stand for two processes: flock(2) locks belong to
    /// open files, so they exclude each other as two processes do.
    #[test]
    fn another_process_waits_and_then_gets_its_turn_before_new_holders() {
        let dir = tempfile::tempdir().unwrap();
        let old = StateLock::new(dir.path());
        let new = StateLock::new(dir.path());
        let old_share = hold(&old);
        let (sender, received) = mpsc::channel();
        let waiting = {
            let new = Arc::clone(&new);
            thread::spawn(move || {
                let held = hold(&new);
                sender.send("new").unwrap();
                thread::sleep(Duration::from_millis(100));
                drop(held);
            })
        };
        assert!(
            received.recv_timeout(Duration::from_millis(200)).is_err(),
            "the other process waits while this one holds the lock"
        );
        // A new holder of the old process now waits behind the other process (the turnstile).
        let (old_sender, old_received) = mpsc::channel();
        let late = {
            let old = Arc::clone(&old);
            thread::spawn(move || {
                let _held = hold(&old);
                old_sender.send("old").unwrap();
            })
        };
        assert!(
            old_received
                .recv_timeout(Duration::from_millis(200))
                .is_err()
        );
        drop(old_share);
        assert_eq!(
            received.recv_timeout(Duration::from_secs(5)).unwrap(),
            "new"
        );
        assert_eq!(
            old_received.recv_timeout(Duration::from_secs(5)).unwrap(),
            "old"
        );
        waiting.join().unwrap();
        late.join().unwrap();
    }
}
