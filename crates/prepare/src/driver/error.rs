//! [`ClaimError`]: why one claim of a prepare or unprepare call failed, kept typed up to the
//! gRPC layer (which sends its text to the kubelet, bounded in length).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tessera_kubelet_grpc::ClaimRef;

use tessera_cdi::SpecDirError;

use crate::cdi_spec::CdiSpecError;
use crate::checkpoint::CheckpointStoreError;
use crate::claims::ClaimSourceError;
use crate::mig::MigError;
use crate::plan::PlanError;
use crate::sharing::SharingError;

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

/// A side effect failed.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    #[error(transparent)]
    Mig(#[from] MigError),
    #[error(transparent)]
    Sharing(#[from] SharingError),
    #[error(transparent)]
    Imex(#[from] crate::imex::ImexError),
    /// A record names an IMEX directory other than the claim's own.
    #[error(
        "the claim's record names the IMEX directory {}, not {}; refusing to use it",
        path.display(),
        expected.display()
    )]
    ForeignImexDirectory { path: PathBuf, expected: PathBuf },
    #[error(transparent)]
    Spec(#[from] CdiSpecError),
    #[error("cannot write or remove the claim's CDI spec: {0}")]
    SpecDir(#[from] SpecDirError),
    #[error("{0}; the claim's side effects were undone or will be at the next start")]
    Checkpoint(Arc<CheckpointStoreError>),
    /// Dynamic MIG: another claim still holds the placement (it is being unprepared).
    #[error(
        "MIG device `{device}` is still held by claim {holder}, which the kubelet has not \
         unprepared yet; retrying"
    )]
    PlacementBusy { device: String, holder: String },
    /// Static MIG: the recorded instance is gone.
    #[error("MIG device `{device}` no longer exists on GPU {gpu}")]
    StaticInstanceGone { device: String, gpu: String },
    /// A record names MPS directories other than the claim's own.
    #[error(
        "the claim's record names the MPS directory {}, not one under {}; refusing to use it",
        path.display(),
        expected.display()
    )]
    ForeignMpsDirectory { path: PathBuf, expected: PathBuf },
    /// A claim UID that cannot name a file (from a damaged or foreign checkpoint).
    #[error(transparent)]
    UnsafeName(#[from] crate::paths::UnsafeName),
    /// The claim's MPS directory could not be created or removed.
    #[error("cannot create or remove the MPS directory {}: {source}", path.display())]
    MpsDirectory { path: PathBuf, source: io::Error },
}

impl From<CheckpointStoreError> for EffectError {
    fn from(error: CheckpointStoreError) -> Self {
        Self::Checkpoint(Arc::new(error))
    }
}

impl EffectError {
    /// A failed checkpoint write, for each claim of the batch it failed.
    pub(super) fn checkpoint(error: &Arc<CheckpointStoreError>) -> Self {
        Self::Checkpoint(Arc::clone(error))
    }
}
