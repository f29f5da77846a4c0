//! The state every handle, request and watch of one fake server shares: the store, the hooks,
//! and the channel that wakes the watches after a change.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::hooks::Hooks;
use crate::store::Store;

/// State shared by every handle, request and watch.
pub(crate) struct Inner {
    pub store: Mutex<Store>,
    /// Carries the newest resourceVersion after every change; watches wait on it.
    pub changes: watch::Sender<u64>,
    pub hooks: Mutex<Hooks>,
    pub version: Mutex<String>,
    pub bookmark_interval: Mutex<Duration>,
}

impl Inner {
    /// Runs a change under the store lock (then the hooks lock) and wakes the watches.
    pub fn mutate<R>(&self, change: impl FnOnce(&mut Store, &Hooks) -> R) -> R {
        let (result, resource_version) = {
            let mut store = self.store.lock().expect("store lock");
            let hooks = self.hooks.lock().expect("hooks lock");
            let result = change(&mut store, &hooks);
            (result, store.resource_version())
        };
        self.changes.send_replace(resource_version);
        result
    }
}
