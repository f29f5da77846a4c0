//! The starvation policy's memory: the groups waiting for capacity
//! (`tessera_placement::group::starvation`). Decisions read it and say what to remember and
//! forget; the worker keeps it.

use std::collections::HashMap;
use std::sync::Mutex;

use tessera_placement::group::membership::GroupKey;
use tessera_placement::group::starvation::Waiting;

/// The groups waiting for capacity.
#[derive(Debug, Default)]
pub struct WaitingGroups {
    groups: Mutex<HashMap<GroupKey, Waiting>>,
}

impl WaitingGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GroupKey, Waiting>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every waiting group.
    pub fn all(&self) -> Vec<Waiting> {
        self.lock().values().cloned().collect()
    }

    /// Remembers `waiting`, unless its group is remembered already (it keeps its first `since`).
    pub fn insert(&self, waiting: Waiting) {
        self.lock().entry(waiting.key.clone()).or_insert(waiting);
    }

    /// Forgets the group `key`.
    pub fn remove(&self, key: &GroupKey) {
        self.lock().remove(key);
    }
}
