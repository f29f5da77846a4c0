//! An in-memory [`GpuControl`] that records every call and keeps the state a real GPU would
//! have (time slices, running MPS daemons), with injectable failures. For tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tessera_api::config::TimeSliceInterval;

use super::{GpuControl, MpsDaemon, MpsDirectories, SharingError};

/// A call made to a [`RecordingGpuControl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuCall {
    SetTimeSlice {
        gpu: String,
        interval: TimeSliceInterval,
    },
    StartMps(MpsDaemon),
    StopMps(MpsDirectories),
}

/// The operations a failure can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuOperation {
    SetTimeSlice,
    StartMps,
    StopMps,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<GpuCall>,
    time_slices: BTreeMap<String, TimeSliceInterval>,
    daemons: BTreeMap<MpsDirectories, MpsDaemon>,
    failures: Vec<GpuOperation>,
}

/// The recording fake.
#[derive(Debug, Default)]
pub struct RecordingGpuControl {
    state: Mutex<State>,
}

impl RecordingGpuControl {
    /// A fake with every GPU at the default time slice and no daemon running.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<GpuCall> {
        self.state().calls.clone()
    }

    /// Forgets the calls so far (the state stays).
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The time slice GPU `gpu_uuid` is set to.
    pub fn time_slice(&self, gpu_uuid: &str) -> TimeSliceInterval {
        self.state()
            .time_slices
            .get(gpu_uuid)
            .copied()
            .unwrap_or_default()
    }

    /// GPUs whose time slice is not the default.
    pub fn non_default_time_slices(&self) -> BTreeMap<String, TimeSliceInterval> {
        self.state()
            .time_slices
            .iter()
            .filter(|(_, i)| **i != TimeSliceInterval::Default)
            .map(|(g, i)| (g.clone(), *i))
            .collect()
    }

    /// The MPS daemons running now.
    pub fn running_daemons(&self) -> Vec<MpsDaemon> {
        self.state().daemons.values().cloned().collect()
    }

    /// Makes the next call of `operation` fail (once per injection).
    pub fn fail_next(&self, operation: GpuOperation) {
        self.state().failures.push(operation);
    }

    /// Forgets every daemon, as a reboot would.
    pub fn reboot(&self) {
        let mut state = self.state();
        state.daemons.clear();
        state.time_slices.clear();
    }

    fn take_failure(state: &mut State, operation: GpuOperation) -> bool {
        match state.failures.iter().position(|f| *f == operation) {
            Some(i) => {
                state.failures.remove(i);
                true
            }
            None => false,
        }
    }
}

impl GpuControl for RecordingGpuControl {
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), SharingError> {
        let mut state = self.state();
        state.calls.push(GpuCall::SetTimeSlice {
            gpu: gpu_uuid.to_owned(),
            interval,
        });
        if Self::take_failure(&mut state, GpuOperation::SetTimeSlice) {
            return Err(SharingError::TimeSlice {
                gpu: gpu_uuid.to_owned(),
                interval,
                reason: "injected failure".into(),
            });
        }
        state.time_slices.insert(gpu_uuid.to_owned(), interval);
        Ok(())
    }

    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError> {
        let mut state = self.state();
        state.calls.push(GpuCall::StartMps(daemon.clone()));
        if Self::take_failure(&mut state, GpuOperation::StartMps) {
            return Err(SharingError::StartMps {
                claim_uid: daemon.claim_uid.clone(),
                pipe: daemon.directories.pipe.clone(),
                reason: "injected failure".into(),
            });
        }
        state
            .daemons
            .insert(daemon.directories.clone(), daemon.clone());
        Ok(())
    }

    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError> {
        let mut state = self.state();
        state.calls.push(GpuCall::StopMps(directories.clone()));
        if Self::take_failure(&mut state, GpuOperation::StopMps) {
            return Err(SharingError::StopMps {
                pipe: directories.pipe.clone(),
                reason: "injected failure".into(),
            });
        }
        state.daemons.remove(directories);
        Ok(())
    }
}
