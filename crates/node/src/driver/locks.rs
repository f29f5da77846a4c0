//! Per-claim locks. A batch takes the locks of all its claims at once (so two batches sharing
//! claims cannot deadlock) and holds them until it is done; batches on other claims run in
//! parallel.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex};

/// The claims some call is working on.
#[derive(Debug, Default)]
pub(crate) struct ClaimLocks {
    held: Mutex<BTreeSet<String>>,
    released: Condvar,
}

/// The locks of one batch; released on drop.
#[derive(Debug)]
pub(crate) struct HeldClaims<'a> {
    locks: &'a ClaimLocks,
    uids: Vec<String>,
}

impl ClaimLocks {
    /// Blocks until none of `uids` is held by another call, then holds them all.
    pub(crate) fn lock(&self, uids: &[String]) -> HeldClaims<'_> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        while uids.iter().any(|uid| held.contains(uid)) {
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.extend(uids.iter().cloned());
        HeldClaims {
            locks: self,
            uids: uids.to_vec(),
        }
    }
}

impl Drop for HeldClaims<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
        for uid in &self.uids {
            held.remove(uid);
        }
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn overlapping_batches_run_one_at_a_time_others_in_parallel() {
        let locks = Arc::new(ClaimLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most_inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (locks, inside, most_inside) = (
                    Arc::clone(&locks),
                    Arc::clone(&inside),
                    Arc::clone(&most_inside),
                );
                std::thread::spawn(move || {
                    // Every batch holds `shared` plus one claim of its own.
                    let uids = vec![format!("own-{i}"), "shared".to_owned()];
                    let _held = locks.lock(&uids);
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_inside.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most_inside.load(Ordering::SeqCst), 1);
        // Disjoint claims do not wait for each other.
        let a = locks.lock(&["a".to_owned()]);
        let b = locks.lock(&["b".to_owned()]);
        drop((a, b));
        assert!(locks.held.lock().unwrap().is_empty());
    }
}
