//! What the daemon stand-in and `nvidia-imex-ctl` say to each other: the daemon's state and its
//! view of the other nodes.

use serde::{Deserialize, Serialize};

/// The daemon's state, as `nvidia-imex-ctl -q` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ImexState {
    Ready,
    /// Still starting (the knob `readyAfterMs`).
    NotReady(String),
    /// Failed (the knob `fail`); it recovers when the knob goes.
    Unavailable(String),
}

impl ImexState {
    /// `READY`, `NOT_READY <why>` or `UNAVAILABLE <why>`.
    pub fn line(&self) -> String {
        match self {
            ImexState::Ready => "READY".into(),
            ImexState::NotReady(why) => format!("NOT_READY {why}"),
            ImexState::Unavailable(why) => format!("UNAVAILABLE {why}"),
        }
    }
}

/// What the daemon knows of one node of its nodes config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PeerStatus {
    /// This daemon's own address.
    #[serde(rename = "SELF")]
    Self_,
    /// Its daemon answers with the same address map.
    Connected,
    /// Its daemon answers with another address map.
    Mismatch,
    /// Nothing answers there.
    Unreachable,
}

impl PeerStatus {
    pub fn name(self) -> &'static str {
        match self {
            PeerStatus::Self_ => "SELF",
            PeerStatus::Connected => "CONNECTED",
            PeerStatus::Mismatch => "MISMATCH",
            PeerStatus::Unreachable => "UNREACHABLE",
        }
    }
}

/// One node in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReport {
    pub address: String,
    pub status: PeerStatus,
}

/// `nvidia-imex-ctl -N -j`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    #[serde(flatten)]
    pub state: ImexState,
    /// This daemon's address.
    pub address: String,
    pub nodes: Vec<PeerReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_json_shape() {
        let report = StatusReport {
            state: ImexState::Unavailable("told to fail".into()),
            address: "10.0.0.1".into(),
            nodes: vec![
                PeerReport {
                    address: "10.0.0.1".into(),
                    status: PeerStatus::Self_,
                },
                PeerReport {
                    address: "10.0.0.2".into(),
                    status: PeerStatus::Connected,
                },
            ],
        };
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(
            json,
            r#"{"state":"UNAVAILABLE","reason":"told to fail","address":"10.0.0.1","nodes":[{"address":"10.0.0.1","status":"SELF"},{"address":"10.0.0.2","status":"CONNECTED"}]}"#
        );
        assert_eq!(serde_json::from_str::<StatusReport>(&json).unwrap(), report);
        assert_eq!(ImexState::Ready.line(), "READY");
        let ready: StatusReport =
            serde_json::from_str(r#"{"state":"READY","address":"a","nodes":[]}"#).unwrap();
        assert_eq!(ready.state, ImexState::Ready);
    }
}
