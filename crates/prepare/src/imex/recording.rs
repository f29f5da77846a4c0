//! An in-memory [`ImexControl`] for tests: records every call, keeps which daemons run, and fails
//! a start when told to.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tessera_kubelet_grpc::ClaimUid;

use super::{ImexControl, ImexDomain, ImexError};

/// One call to the control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImexCall {
    Start { claim_uid: String, channel: u32 },
    Stop { claim_uid: String },
}

/// Records calls; [`RecordingImexControl::fail_starts`] makes starts fail.
#[derive(Debug, Default)]
pub struct RecordingImexControl {
    calls: Mutex<Vec<ImexCall>>,
    running: Mutex<BTreeSet<String>>,
    fail: Mutex<Option<String>>,
}

impl RecordingImexControl {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<ImexCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The claims whose daemons run.
    pub fn running(&self) -> BTreeSet<String> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts fail with `reason` until called with `None`.
    pub fn fail_starts(&self, reason: Option<&str>) {
        *self.fail.lock().unwrap_or_else(|e| e.into_inner()) = reason.map(str::to_owned);
    }
}

impl ImexControl for RecordingImexControl {
    fn start(&self, domain: &ImexDomain) -> Result<(), ImexError> {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ImexCall::Start {
                claim_uid: domain.claim_uid.clone(),
                channel: domain.channel,
            });
        if let Some(reason) = self.fail.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(ImexError::Start {
                claim: domain.claim(),
                channel: domain.channel,
                reason,
            });
        }
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(domain.claim_uid.clone());
        Ok(())
    }

    fn stop(&self, claim_uid: &str, _directory: &std::path::Path) -> Result<(), ImexError> {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ImexCall::Stop {
                claim_uid: claim_uid.to_owned(),
            });
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(claim_uid);
        Ok(())
    }

    fn domains(&self) -> Result<Vec<ClaimUid>, ImexError> {
        Ok(self.running().into_iter().map(ClaimUid::new).collect())
    }
}
