//! A domain's daemon health on its claim (pure): the condition each node writes on the domain's
//! claim, and the Event a change of it records.
//!
//! The domain is one ResourceClaim shared by pods on several nodes, allocated one device (the
//! channel). Where it shows: `status.devices[]`, the entry of the channel device (KEP-4817: what a
//! driver reports about an allocated device), whose `conditions` is a list keyed by `type`. Every
//! node of the domain writes there, so each node has a condition of its own, of type
//! `<node>/IMEXDaemonReady` ([`condition_type`]): `True` while the node's daemon answers `READY`,
//! `False` with the daemon's answer while it does not. Each node writes with a field manager of its
//! own ([`field_manager`]) by server-side apply: the API server merges the entry's conditions by
//! type, so a node owns exactly its condition, never overwrites another node's, and never
//! conflicts with one (the entry's key fields are shared by all). Taking a node's condition back
//! (its last pod of the domain left) is applying an empty configuration under its manager; the
//! entry goes with the last manager that held a part of it. One condition per claim, with every
//! node's state in it, would need a read-modify-write race between nodes; one per node needs none.
//!
//! Events: a Warning [`NOT_READY_REASON`] when a node's daemon stops (or never starts) answering
//! `READY`, a Normal [`READY_REASON`] when it answers again ([`change`]); nothing while the state
//! holds.

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_api::DRIVER_NAME;
use tessera_api::imex::{DEVICE_PREFIX, POOL_PREFIX};

/// The name part of a node's condition type (`explain` reads it too).
pub const CONDITION_NAME: &str = tessera_api::imex::DAEMON_CONDITION;
/// The condition's reason while the daemon answers `READY`, and the Event's on recovery.
pub const READY_REASON: &str = "IMEXDaemonReady";
/// The condition's reason while it does not, and the Warning Event's.
pub const NOT_READY_REASON: &str = "IMEXDaemonNotReady";
/// The longest field manager name the API server accepts.
const MAX_FIELD_MANAGER: usize = 128;
/// Condition messages are cut to this many bytes (the API server allows 32 KiB).
const MAX_MESSAGE: usize = 4096;

/// What a node's daemon answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonHealth {
    /// `READY`.
    Ready,
    /// Anything else: the answer, or why there is none.
    NotReady(String),
}

impl DaemonHealth {
    pub fn is_ready(&self) -> bool {
        matches!(self, DaemonHealth::Ready)
    }
}

/// A node's condition as the claim holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub ready: bool,
    pub message: String,
    pub since: Time,
}

/// The type of node `node`'s condition: `<node>/IMEXDaemonReady` (a node name is a DNS
/// subdomain, what a qualified name's prefix must be).
pub fn condition_type(node: &str) -> String {
    format!("{node}/{CONDITION_NAME}")
}

/// The field manager of node `node`'s condition: `tessera-imex/<node>`, or with a hash of a name
/// too long for one.
pub fn field_manager(node: &str) -> String {
    let manager = format!("tessera-imex/{node}");
    if manager.len() <= MAX_FIELD_MANAGER {
        return manager;
    }
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("tessera-imex/{hash:016x}")
}

/// The pool and device of the claim's channel, from its allocation.
pub fn channel_device(claim: &ResourceClaim) -> Option<(String, String)> {
    let allocation = claim.status.as_ref()?.allocation.as_ref()?;
    allocation
        .devices
        .as_ref()?
        .results
        .iter()
        .flatten()
        .find(|r| {
            r.driver == DRIVER_NAME
                && r.pool.starts_with(POOL_PREFIX)
                && r.device.starts_with(DEVICE_PREFIX)
        })
        .map(|r| (r.pool.clone(), r.device.clone()))
}

/// Node `node`'s condition on the claim, if it has one.
pub fn recorded(claim: &ResourceClaim, node: &str) -> Option<Recorded> {
    let wanted = condition_type(node);
    let condition = claim
        .status
        .as_ref()?
        .devices
        .iter()
        .flatten()
        .filter(|d| d.driver == DRIVER_NAME)
        .flat_map(|d| d.conditions.iter().flatten())
        .find(|c| c.type_ == wanted)?;
    Some(Recorded {
        ready: condition.status == "True",
        message: condition.message.clone(),
        since: condition.last_transition_time.clone(),
    })
}

/// The condition a node records for `health`, given what it recorded before (the transition time
/// moves only when readiness changes).
pub fn next(previous: Option<&Recorded>, health: &DaemonHealth, now: Time) -> Recorded {
    let ready = health.is_ready();
    let since = match previous {
        Some(p) if p.ready == ready => p.since.clone(),
        _ => now,
    };
    let message = match health {
        DaemonHealth::Ready => "the IMEX daemon answers READY".to_owned(),
        DaemonHealth::NotReady(answer) => truncate(answer, MAX_MESSAGE),
    };
    Recorded {
        ready,
        message,
        since,
    }
}

/// The Event a change from `previous` to `health` records: `(warning, reason)`. A daemon that
/// becomes ready for the first time records nothing (it is the normal course of prepare).
pub fn change(previous: Option<&Recorded>, health: &DaemonHealth) -> Option<(bool, &'static str)> {
    let was_ready = previous.map(|p| p.ready);
    match health {
        DaemonHealth::NotReady(_) if was_ready != Some(false) => Some((true, NOT_READY_REASON)),
        DaemonHealth::Ready if was_ready == Some(false) => Some((false, READY_REASON)),
        _ => None,
    }
}

/// The server-side apply configuration of node `node`'s condition on the claim's channel entry.
pub fn apply_configuration(
    claim: &ResourceClaim,
    (pool, device): (&str, &str),
    node: &str,
    condition: &Recorded,
) -> serde_json::Value {
    let mut configuration = empty_configuration(claim);
    configuration["status"] = serde_json::json!({"devices": [{
        "driver": DRIVER_NAME,
        "pool": pool,
        "device": device,
        "conditions": [{
            "type": condition_type(node),
            "status": if condition.ready { "True" } else { "False" },
            "reason": if condition.ready { READY_REASON } else { NOT_READY_REASON },
            "message": condition.message,
            "lastTransitionTime": condition.since,
        }],
    }]});
    configuration
}

/// The configuration that takes back what a node's manager applied (nothing in `status`).
pub fn empty_configuration(claim: &ResourceClaim) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": claim.metadata.namespace,
            "name": claim.metadata.name,
            "uid": claim.metadata.uid,
        },
        "status": {},
    })
}

fn truncate(text: &str, max: usize) -> String {
    crate::claims::truncate(text, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(conditions: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ml", "name": "domain", "uid": "u-1"},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": DRIVER_NAME, "pool": "tray-1", "device": "gpu-0"},
                    {"request": "channel", "driver": DRIVER_NAME, "pool": "imex-c.1", "device": "channel-3"},
                ]}},
                "devices": [{"driver": DRIVER_NAME, "pool": "imex-c.1", "device": "channel-3",
                    "conditions": conditions}],
            },
        }))
        .unwrap()
    }

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn each_node_has_its_own_condition_type_and_manager() {
        assert_eq!(condition_type("tray-4"), "tray-4/IMEXDaemonReady");
        assert_eq!(field_manager("tray-4"), "tessera-imex/tray-4");
        let long = "n".repeat(253);
        let manager = field_manager(&long);
        assert!(manager.len() <= MAX_FIELD_MANAGER, "{manager}");
        assert_ne!(manager, field_manager(&"m".repeat(253)));
    }

    #[test]
    fn the_channel_is_the_allocations_imex_device_and_a_nodes_condition_is_read_back() {
        let claim = claim(json!([{"type": "tray-4/IMEXDaemonReady", "status": "False",
            "reason": NOT_READY_REASON, "message": "UNAVAILABLE link down",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]));
        assert_eq!(
            channel_device(&claim),
            Some(("imex-c.1".to_owned(), "channel-3".to_owned()))
        );
        let found = recorded(&claim, "tray-4").unwrap();
        assert!(!found.ready);
        assert_eq!(found.message, "UNAVAILABLE link down");
        assert_eq!(recorded(&claim, "tray-1"), None);
    }

    #[test]
    fn the_transition_time_moves_only_when_readiness_changes() {
        let failing = DaemonHealth::NotReady("UNAVAILABLE link down".into());
        let first = next(None, &failing, at(10));
        assert_eq!((first.ready, first.since.clone()), (false, at(10)));
        let still = next(
            Some(&first),
            &DaemonHealth::NotReady("NOT_READY".into()),
            at(20),
        );
        assert_eq!(
            (still.since.clone(), still.message.as_str()),
            (at(10), "NOT_READY")
        );
        let recovered = next(Some(&still), &DaemonHealth::Ready, at(30));
        assert_eq!((recovered.ready, recovered.since), (true, at(30)));
    }

    #[test]
    fn events_mark_a_failure_and_a_recovery_not_a_first_start_or_a_steady_state() {
        let failing = DaemonHealth::NotReady("x".into());
        let down = next(None, &failing, at(1));
        let up = next(None, &DaemonHealth::Ready, at(1));
        assert_eq!(change(None, &DaemonHealth::Ready), None);
        assert_eq!(change(None, &failing), Some((true, NOT_READY_REASON)));
        assert_eq!(change(Some(&up), &failing), Some((true, NOT_READY_REASON)));
        assert_eq!(change(Some(&down), &failing), None);
        assert_eq!(
            change(Some(&down), &DaemonHealth::Ready),
            Some((false, READY_REASON))
        );
        assert_eq!(change(Some(&up), &DaemonHealth::Ready), None);
    }

    #[test]
    fn the_configuration_names_the_channel_entry_and_only_this_nodes_condition() {
        let claim = claim(json!([]));
        let condition = next(None, &DaemonHealth::NotReady("UNAVAILABLE".into()), at(5));
        let applied = apply_configuration(&claim, ("imex-c.1", "channel-3"), "tray-4", &condition);
        assert_eq!(applied["metadata"]["uid"], json!("u-1"));
        let entry = &applied["status"]["devices"][0];
        assert_eq!(
            (&entry["driver"], &entry["pool"], &entry["device"]),
            (&json!(DRIVER_NAME), &json!("imex-c.1"), &json!("channel-3"))
        );
        let conditions = entry["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], json!("tray-4/IMEXDaemonReady"));
        assert_eq!(conditions[0]["status"], json!("False"));
        assert_eq!(conditions[0]["reason"], json!(NOT_READY_REASON));
        assert_eq!(empty_configuration(&claim)["status"], json!({}));
    }
}
