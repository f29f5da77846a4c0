//! IMEX domains on this node: what a claim holding an IMEX channel needs, behind [`ImexControl`].
//!
//! A claim of class `imex.gpu.tessera.dev` is one IMEX domain (docs/user-guide.md, "Jobs across
//! NVLink racks (IMEX)"). On every node where one of its pods runs, the kubelet prepares it, and
//! prepare then (1) has an IMEX daemon of that domain running and `READY` on this node
//! ([`ImexControl::start`], which must answer within the kubelet's deadline or fail with the
//! reason), and (2) gives the claim's containers the channel's device node, its number and the
//! domain's IMEX configuration (the CDI spec, [`crate::cdi_spec`]). Unprepare — the kubelet's, when
//! the last pod of the domain on this node is gone — stops the daemon and removes its directory
//! ([`ImexControl::stop`]).
//!
//! What to run is computed from the claim's record (pure: [`ImexDomain::of`]); how it runs is the
//! control's business: the node plugin's `PodImexControl` runs each domain's daemon in a pod of its
//! own (so it outlives the plugin's pod), writes its configuration with the peers' addresses and
//! keeps that list current; [`RecordingImexControl`] records calls (tests).
//!
//! Every operation is idempotent: starting a running daemon only waits for it to be ready,
//! stopping one that is not running succeeds. Recovery relies on this.

mod recording;

use std::path::PathBuf;

use tessera_kubelet_grpc::ClaimUid;

pub use recording::{ImexCall, RecordingImexControl};

use crate::checkpoint::ClaimRecord;

/// The directory under the plugin's state directory that holds one directory per domain.
pub const IMEX_DIRECTORY: &str = "imex";
/// The domain's configuration file in its directory.
pub const CONFIG_FILE: &str = "config.cfg";
/// The domain's nodes config (one peer address per line) in its directory.
pub const NODES_FILE: &str = "nodes_config.cfg";
/// The daemon's command socket in its directory.
pub const COMMAND_SOCKET: &str = "cmd.sock";

/// One domain's daemon on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexDomain {
    /// The claim (the domain).
    pub claim_uid: String,
    pub namespace: String,
    pub name: String,
    /// The domain's channel.
    pub channel: u32,
    /// The fabric clique the channel belongs to.
    pub clique: String,
    /// The domain's directory on the host: its configuration and the daemon's command socket.
    pub directory: PathBuf,
}

impl ImexDomain {
    /// The domain a claim's record holds, if it holds a channel.
    pub fn of(claim_uid: &str, record: &ClaimRecord) -> Option<ImexDomain> {
        let imex = record.imex.as_ref()?;
        Some(ImexDomain {
            claim_uid: claim_uid.to_owned(),
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            channel: imex.channel,
            clique: imex.clique.clone(),
            directory: PathBuf::from(&imex.directory),
        })
    }

    /// `namespace/name`, for messages.
    pub fn claim(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// An IMEX operation failed. The reason says what the daemon, the API server or the system
/// answered; the kubelet retries prepare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImexError {
    /// IMEX is turned off on this node.
    #[error(
        "IMEX is turned off on this node (tessera-kubelet-plugin --imex=false, chart value \
         imex.enabled): it cannot prepare IMEX channel claims"
    )]
    Disabled,
    /// Starting the domain's daemon, or waiting for it to be ready, failed.
    #[error(
        "the IMEX daemon of domain {claim} (channel {channel}) is not ready on this node: {reason}"
    )]
    Start {
        claim: String,
        channel: u32,
        reason: String,
    },
    /// Stopping the domain's daemon failed.
    #[error("cannot stop the IMEX daemon of domain {claim_uid}: {reason}")]
    Stop { claim_uid: String, reason: String },
    /// Listing the daemons failed (recovery).
    #[error("cannot list this node's IMEX daemons: {0}")]
    List(String),
}

/// How IMEX daemons are run on this node.
pub trait ImexControl: Send + Sync {
    /// Has `domain`'s daemon running and ready on this node, its configuration written; returns
    /// once it is ready, or fails with why not (within the kubelet's deadline).
    fn start(&self, domain: &ImexDomain) -> Result<(), ImexError>;

    /// Stops the daemon of claim `claim_uid` and removes `directory`; succeeds when none runs.
    fn stop(&self, claim_uid: &str, directory: &std::path::Path) -> Result<(), ImexError>;

    /// The claims this control runs daemons for (recovery stops those no record knows).
    fn domains(&self) -> Result<Vec<ClaimUid>, ImexError> {
        Ok(Vec::new())
    }
}

/// No IMEX on this node: every channel claim fails with [`ImexError::Disabled`]; stopping
/// succeeds (there is nothing to stop).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoImex;

impl ImexControl for NoImex {
    fn start(&self, _domain: &ImexDomain) -> Result<(), ImexError> {
        Err(ImexError::Disabled)
    }

    fn stop(&self, _claim_uid: &str, _directory: &std::path::Path) -> Result<(), ImexError> {
        Ok(())
    }
}
