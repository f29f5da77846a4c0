//! [`ClaimError`]: why one claim of a prepare or unprepare call failed, kept typed up to the
//! gRPC layer (which sends its text to the kubelet, bounded in length).

use std::fmt;
use std::sync::Arc;

use tessera_kubelet_grpc::ClaimRef;

use super::effects::EffectError;
use crate::claims::ClaimSourceError;
use crate::plan::PlanError;

/// One claim failed: which claim, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("claim {claim}: {failure}")]
pub struct ClaimError {
    /// `namespace/name (uid)`.
    pub claim: String,
    /// What went wrong (shared: a batch's results are cloned by callers).
    pub failure: Arc<ClaimFailure>,
}

/// What went wrong with one claim.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFailure {
    /// The API server has no such claim.
    #[error("the claim does not exist in the API server")]
    NotFound,
    /// The claim could not be read from the API server.
    #[error(transparent)]
    Read(#[from] ClaimSourceError),
    /// The claim's allocation or configuration cannot be prepared here (bad input).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A side effect (MIG, sharing, CDI spec, checkpoint) failed.
    #[error(transparent)]
    Effect(#[from] EffectError),
    /// Start-up recovery has not finished: no new claim is prepared until it has.
    #[error(
        "the node plugin is still recovering its state and prepares no new claim until it has \
         ({0}); the kubelet retries"
    )]
    Recovering(String),
    /// The driver's own work failed unexpectedly (a panic).
    #[error("internal error in the node plugin: {0}")]
    Internal(String),
}

impl ClaimError {
    /// `claim` failed with `failure`.
    pub fn new(claim: &ClaimRef, failure: impl Into<ClaimFailure>) -> Self {
        Self {
            claim: claim.to_string(),
            failure: Arc::new(failure.into()),
        }
    }
}

/// How much of an error logs show: errors echo user values (config fields, names), which must
/// not reach the log whole.
pub(crate) const LOGGED_BYTES: usize = 1024;

/// An error's text for a log line, bounded like the kubelet's copy.
pub(crate) fn logged(error: &impl fmt::Display) -> String {
    tessera_kubelet_grpc::bounded(&error.to_string(), LOGGED_BYTES)
}
