//! [`NodeInventory`]: the node's GPU inventory as last read, owned once and shared by the slice
//! publisher (which rescans it) and claim preparation (which resolves device names with it and
//! rescans it when a name is unknown).
//!
//! A rescan keeps GPUs the read reports lost with their last known facts ([`lost`]), so a lost
//! GPU stays published (tainted) and its prepared claims keep resolving.

pub mod lost;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tessera_gpu_inventory::{DeviceSource, GpuInventory, SourceError};

use lost::LostGpus;

/// The node's GPUs: where they are read from and what the last read found.
pub struct NodeInventory {
    source: Arc<dyn DeviceSource>,
    state: Mutex<State>,
}

struct State {
    current: Arc<GpuInventory>,
    lost: LostGpus,
}

impl std::fmt::Debug for NodeInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeInventory")
            .field("source", &self.source.describe())
            .finish_non_exhaustive()
    }
}

impl NodeInventory {
    /// Reads the GPUs from `source` (blocking: NVML or a file).
    pub fn read(source: Arc<dyn DeviceSource>) -> Result<Self, SourceError> {
        let current = Arc::new(source.inventory()?);
        Ok(Self {
            source,
            state: Mutex::new(State {
                current,
                lost: LostGpus::default(),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the GPUs are read from.
    pub fn source(&self) -> &Arc<dyn DeviceSource> {
        &self.source
    }

    /// The inventory of the last successful read.
    pub fn current(&self) -> Arc<GpuInventory> {
        Arc::clone(&self.state().current)
    }

    /// Reads the GPUs again (blocking: NVML or a file) and makes the result current; GPUs the
    /// read reports lost keep their facts from the current inventory. On error the current
    /// inventory stays.
    pub fn rescan(&self) -> Result<Arc<GpuInventory>, SourceError> {
        let read = self.source.inventory()?;
        let mut state = self.state();
        let previous = Arc::clone(&state.current);
        let merged = Arc::new(state.lost.merge(read, Some(&previous), SystemTime::now()));
        state.current = Arc::clone(&merged);
        Ok(merged)
    }

    /// The lost GPUs kept in the inventory with their last known facts, each with when a
    /// rescan first found it lost.
    pub fn lost_gpus(&self) -> Vec<(String, SystemTime)> {
        let state = self.state();
        let kept = state.lost.kept_since();
        kept.map(|(uuid, since)| (uuid.to_owned(), since)).collect()
    }
}

#[cfg(test)]
mod tests {
    use tessera_gpu_inventory::MockSource;

    use super::*;

    #[test]
    fn a_rescan_replaces_the_current_inventory() {
        let inventory =
            NodeInventory::read(Arc::new(MockSource::new("dgx-h100").unwrap())).unwrap();
        let first = inventory.current();
        assert_eq!(first.gpus.len(), 8);
        let read = inventory.rescan().unwrap();
        assert_eq!(*read, *first);
        assert!(Arc::ptr_eq(&read, &inventory.current()));
    }
}
