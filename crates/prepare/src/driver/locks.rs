//! Per-claim locks. A call takes the locks of all its claims at once (so two calls sharing
//! claims cannot deadlock) before it reads them from the API server, and holds them until it
//! has answered; calls on other claims run in parallel, so one slow claim never holds up an
//! unrelated one. The lock is async (a call waiting for a claim occupies no thread) and its
//! guard is owned, so it can travel into the blocking part of the call.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tessera_kubelet_grpc::ClaimUid;
use tokio::sync::Notify;

/// The claims some call is working on.
#[derive(Debug, Default)]
pub(crate) struct ClaimLocks {
    held: Mutex<BTreeSet<ClaimUid>>,
    released: Notify,
}

/// The locks of one call; released on drop.
#[derive(Debug)]
pub(crate) struct HeldClaims {
    locks: Arc<ClaimLocks>,
    uids: Vec<ClaimUid>,
}

impl ClaimLocks {
    fn held(&self) -> std::sync::MutexGuard<'_, BTreeSet<ClaimUid>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until none of `uids` is held by another call, then holds them all.
    pub(crate) async fn lock(self: &Arc<Self>, uids: &[ClaimUid]) -> HeldClaims {
        loop {
            // Registered before the check, so a release between the check and the wait is
            // not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.held();
                if !uids.iter().any(|uid| held.contains(uid)) {
                    held.extend(uids.iter().cloned());
                    return HeldClaims {
                        locks: Arc::clone(self),
                        uids: uids.to_vec(),
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for HeldClaims {
    fn drop(&mut self) {
        let mut held = self.locks.held();
        for uid in &self.uids {
            held.remove(uid);
        }
        drop(held);
        self.locks.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn overlapping_calls_run_one_at_a_time_others_in_parallel() {
        let locks = Arc::new(ClaimLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most_inside = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (locks, inside, most_inside) = (
                    Arc::clone(&locks),
                    Arc::clone(&inside),
                    Arc::clone(&most_inside),
                );
                tokio::spawn(async move {
                    // Every call holds `shared` plus one claim of its own.
                    let uids = vec![ClaimUid::new(format!("own-{i}")), ClaimUid::new("shared")];
                    let _held = locks.lock(&uids).await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_inside.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(most_inside.load(Ordering::SeqCst), 1);
        // Disjoint claims do not wait for each other, even while one is held.
        let a = locks.lock(&[ClaimUid::new("a")]).await;
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock(&[ClaimUid::new("b")]))
            .await
            .expect("an unrelated claim is not held up");
        drop((a, b));
        assert!(locks.held().is_empty());
    }
}
