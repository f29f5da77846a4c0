//! The node plugin's checkpoint: what it has prepared on this node, persisted so that a restart
//! (or a crash at any point) converges instead of leaking devices, CDI specs or MPS daemons.
//!
//! The file is a versioned envelope around the [`Checkpoint`] payload:
//!
//! ```json
//! {"version": 2, "checksum": "sha256:<hex>",
//!  "checkpoint": {"bootId": "...", "nodeName": "node-a", "poolName": "node-a", "claims": {...}}}
//! ```
//!
//! Version 2 records the node and pool the checkpoint belongs to, so that a checkpoint copied
//! from another node is recognised ([`check_owner`]) instead of being acted on. Version 1 (the
//! same without `nodeName` and `poolName`) is still read: its node is unknown, so
//! [`check_owner`] accepts it only if every GPU it names is one of this node's; it is written
//! back as version 2.
//!
//! The checksum covers the canonical JSON encoding of the payload (`serde_json` of the typed
//! value; every map is ordered, so the encoding is deterministic). [`decode`] refuses a file whose
//! version it does not know, whose checksum does not match or that does not parse, with an error
//! saying which; the node plugin then quarantines the file and rebuilds its state. No IO here.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessera_kubelet_grpc::ClaimUid;

use tessera_api::config::Sharing;

/// The checkpoint format this build writes.
pub const CHECKPOINT_VERSION: u32 = 2;
/// The older format this build still reads (and migrates).
pub const CHECKPOINT_VERSION_1: u32 = 1;

/// Everything the node plugin has prepared (or is preparing or unpreparing) on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Checkpoint {
    /// `/proc/sys/kernel/random/boot_id` when the checkpoint was written. A different boot id
    /// at start means the node rebooted: MIG instances and MPS daemons recorded here are gone.
    pub boot_id: String,
    /// The node whose plugin wrote the checkpoint (version 2; empty when read from version 1).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// The pool of that node's devices (version 2; empty when read from version 1).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool_name: String,
    /// Claims by UID.
    #[serde(default, with = "claims_by_uid")]
    pub claims: BTreeMap<ClaimUid, ClaimRecord>,
}

/// The claims map of the file: claim UIDs as its keys (JSON object keys are strings).
mod claims_by_uid {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        claims: &BTreeMap<ClaimUid, ClaimRecord>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(claims.iter().map(|(uid, record)| (uid.as_str(), record)))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<ClaimUid, ClaimRecord>, D::Error> {
        let claims = BTreeMap::<String, ClaimRecord>::deserialize(deserializer)?;
        Ok(claims
            .into_iter()
            .map(|(uid, record)| (ClaimUid::new(uid), record))
            .collect())
    }
}

/// One claim the plugin has touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRecord {
    /// `metadata.namespace` of the claim.
    pub namespace: String,
    /// `metadata.name` of the claim.
    pub name: String,
    /// How far the claim got.
    pub state: ClaimState,
    /// The claim's devices on this node, in allocation-result order.
    pub devices: Vec<DeviceRecord>,
    /// The claim's MPS control daemon, when any of its devices is shared with MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsRecord>,
    /// The claim's IMEX channel, when it is an IMEX domain. (Absent from the file otherwise, so
    /// checkpoints without IMEX claims read the same in builds before it.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imex: Option<ImexRecord>,
}

impl ClaimRecord {
    /// `namespace/name`, for messages.
    pub fn display_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The states of a claim on this node. A claim that is fully unprepared has no record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimState {
    /// Recorded before the first side effect of prepare (MIG creation, sharing, CDI spec).
    /// Found at start, it means prepare was interrupted: everything it may have done is undone.
    PrepareStarted,
    /// Every side effect is done and the CDI spec is written; the kubelet may have the ids.
    PrepareCompleted,
    /// Recorded before the first side effect of unprepare. Found at start, unprepare is finished.
    UnprepareStarted,
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimState::PrepareStarted => "PrepareStarted",
            ClaimState::PrepareCompleted => "PrepareCompleted",
            ClaimState::UnprepareStarted => "UnprepareStarted",
        })
    }
}

/// One allocated device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceRecord {
    /// The allocation result's `request`, as allocated (`req` or `req/sub`).
    pub request: String,
    /// The pool (this node's name).
    pub pool: String,
    /// The device name in the pool (`gpu-0`, `gpu-3-mig-1g-10gb-6`).
    pub device: String,
    /// The fully qualified CDI device ids handed to the kubelet for this device.
    pub cdi_device_ids: Vec<String>,
    /// The hardware behind the device.
    pub target: DeviceTarget,
    /// The effective sharing configuration (class config, then claim config), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// The part of a multi-allocatable device this claim was allocated (consumable shares):
    /// other claims may hold the same device. Absent for a device allocated whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<DeviceShare>,
}

/// A claim's part of a shared device, from its allocation result (`shareID`,
/// `consumedCapacity`) and the node's consumable-shares mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceShare {
    /// The allocation result's `shareID`, handed back to the kubelet.
    pub share_id: String,
    /// Device memory consumed, in bytes (`consumedCapacity.memory`), if the result says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Shares consumed (`consumedCapacity.shares`, N-shares mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<u64>,
    /// Shares the device is split into (the node's N), when `shares` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_shares: Option<u64>,
}

impl DeviceRecord {
    /// Whether the device is shared with MPS (served by the claim's MPS daemon).
    pub fn uses_mps(&self) -> bool {
        self.sharing
            .as_ref()
            .is_some_and(|s| s.strategy == tessera_api::config::SharingStrategy::Mps)
    }
}

/// What a device name stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type", deny_unknown_fields)]
pub enum DeviceTarget {
    /// A whole GPU.
    #[serde(rename_all = "camelCase")]
    Gpu {
        /// `GPU-<uuid>`.
        uuid: String,
        /// The device minor: `/dev/nvidia<minor>`.
        minor: u32,
    },
    /// A MIG device.
    #[serde(rename_all = "camelCase")]
    Mig {
        /// The parent GPU's UUID.
        parent_uuid: String,
        /// The parent GPU's device minor.
        parent_minor: u32,
        /// The GPU-instance profile, e.g. `1g.10gb`.
        profile: String,
        /// The first memory slice of the placement.
        placement_start: u32,
        /// Whether the plugin creates the instance on prepare and destroys it on unprepare
        /// (dynamic MIG) or uses an instance that exists independently (static MIG).
        lifecycle: MigLifecycle,
        /// The MIG device, once it exists. For a dynamic device this is `None` until the
        /// plugin has created it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<MigInstanceRecord>,
    },
}

impl DeviceTarget {
    /// The UUID containers see: the GPU's, or the MIG device's once it exists.
    pub fn visible_uuid(&self) -> Option<&str> {
        match self {
            DeviceTarget::Gpu { uuid, .. } => Some(uuid),
            DeviceTarget::Mig { instance, .. } => instance.as_ref().map(|i| i.uuid.as_str()),
        }
    }

    /// The UUID of the physical GPU.
    pub fn gpu_uuid(&self) -> &str {
        match self {
            DeviceTarget::Gpu { uuid, .. } => uuid,
            DeviceTarget::Mig { parent_uuid, .. } => parent_uuid,
        }
    }

    /// The device minor of the physical GPU.
    pub fn gpu_minor(&self) -> u32 {
        match self {
            DeviceTarget::Gpu { minor, .. } => *minor,
            DeviceTarget::Mig { parent_minor, .. } => *parent_minor,
        }
    }
}

/// Who owns a MIG device's existence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigLifecycle {
    /// The instance exists independently of claims (static MIG); never created or destroyed.
    Static,
    /// The plugin creates the instance on prepare and destroys it on unprepare (dynamic MIG).
    Dynamic,
}

/// An existing MIG device: the ids NVML needs to destroy it and the UUID containers see.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInstanceRecord {
    /// `MIG-<uuid>`.
    pub uuid: String,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance_id: u32,
}

/// The MPS control daemon of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsRecord {
    /// `CUDA_MPS_PIPE_DIRECTORY` of the daemon, on the host.
    pub pipe_directory: String,
    /// `CUDA_MPS_LOG_DIRECTORY` of the daemon, on the host.
    pub log_directory: String,
}

/// The IMEX channel of a claim (one domain): a device of the clique's pool, not of this node's,
/// and the domain's directory on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImexRecord {
    /// The allocation result's `request`.
    pub request: String,
    /// The channel pool, `imex-<clique>`.
    pub pool: String,
    /// `channel-<n>`.
    pub device: String,
    /// The fully qualified CDI device ids handed to the kubelet for the channel.
    pub cdi_device_ids: Vec<String>,
    /// The channel number: `/dev/nvidia-caps-imex-channels/channel<n>`.
    pub channel: u32,
    /// The fabric clique.
    pub clique: String,
    /// The domain's directory on the host (its IMEX configuration and command socket).
    pub directory: String,
}

/// Why a checkpoint file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Not JSON, or not the envelope / payload shape.
    #[error("the checkpoint cannot be parsed: {0}")]
    Unparsable(String),
    /// Written by a version of Tessera this one cannot read.
    #[error(
        "the checkpoint has version {found}, but this build reads only versions \
         {CHECKPOINT_VERSION_1} and {CHECKPOINT_VERSION}"
    )]
    UnknownVersion {
        /// The version in the file.
        found: Value,
    },
    /// Recorded for another node or pool: the file was copied from another node.
    #[error(
        "the checkpoint belongs to node `{node}` (pool `{pool}`), not to this node `{this_node}` \
         (pool `{this_pool}`): it was copied from another node"
    )]
    ForeignNode {
        node: String,
        pool: String,
        this_node: String,
        this_pool: String,
    },
    /// A version 1 checkpoint (no node recorded) names GPUs this node does not have.
    #[error(
        "the checkpoint (version 1, which does not record its node) names GPUs this node does \
         not have ({}): it was copied from another node",
        gpus.join(", ")
    )]
    ForeignGpus { gpus: Vec<String> },
    /// The payload does not match its checksum: the file was damaged or edited.
    #[error(
        "the checkpoint's checksum does not match its content (recorded {recorded}, computed {computed})"
    )]
    ChecksumMismatch {
        /// The checksum in the file.
        recorded: String,
        /// The checksum of the payload as read.
        computed: String,
    },
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    version: u32,
    checksum: String,
    checkpoint: &'a Checkpoint,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeIn {
    #[serde(rename = "version")]
    _version: u32,
    checksum: String,
    checkpoint: Checkpoint,
}

/// The checksum of a payload: `sha256:` and the hex digest of its canonical JSON.
pub fn checksum(checkpoint: &Checkpoint) -> String {
    // Serializing plain structs, strings and ordered maps cannot fail.
    let canonical = serde_json::to_vec(checkpoint).unwrap_or_default();
    let digest = Sha256::digest(&canonical);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Encodes a checkpoint as the file's bytes (versioned envelope with checksum).
pub fn encode(checkpoint: &Checkpoint) -> Vec<u8> {
    let envelope = EnvelopeOut {
        version: CHECKPOINT_VERSION,
        checksum: checksum(checkpoint),
        checkpoint,
    };
    let mut bytes = serde_json::to_vec_pretty(&envelope).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Decodes a checkpoint file: the version must be [`CHECKPOINT_VERSION`], the payload must
/// parse strictly and match its checksum.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| CheckpointError::Unparsable(e.to_string()))?;
    let Value::Object(object) = &value else {
        return Err(CheckpointError::Unparsable(
            "the file is not a JSON object".to_owned(),
        ));
    };
    let version = match object.get("version") {
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(CHECKPOINT_VERSION)) => {
            CHECKPOINT_VERSION
        }
        Some(Value::Number(n)) if n.as_u64() == Some(u64::from(CHECKPOINT_VERSION_1)) => {
            CHECKPOINT_VERSION_1
        }
        Some(found) => {
            return Err(CheckpointError::UnknownVersion {
                found: found.clone(),
            });
        }
        None => {
            return Err(CheckpointError::Unparsable(
                "the field `version` is missing".to_owned(),
            ));
        }
    };
    let envelope: EnvelopeIn = serde_path_to_error::deserialize(value)
        .map_err(|e| CheckpointError::Unparsable(format!("field `{}`: {}", e.path(), e.inner())))?;
    let computed = checksum(&envelope.checkpoint);
    if computed != envelope.checksum {
        return Err(CheckpointError::ChecksumMismatch {
            recorded: envelope.checksum,
            computed,
        });
    }
    let checkpoint = envelope.checkpoint;
    let recorded_owner = !checkpoint.node_name.is_empty() && !checkpoint.pool_name.is_empty();
    match version {
        CHECKPOINT_VERSION if !recorded_owner => Err(CheckpointError::Unparsable(
            "fields `checkpoint.nodeName` and `checkpoint.poolName` are required in version 2"
                .to_owned(),
        )),
        CHECKPOINT_VERSION_1 if recorded_owner => Err(CheckpointError::Unparsable(
            "version 1 has no fields `checkpoint.nodeName` and `checkpoint.poolName`".to_owned(),
        )),
        _ => Ok(checkpoint),
    }
}

/// Refuses a checkpoint that is not this node's: one recorded for another node or pool, or a
/// version 1 checkpoint (node not recorded) naming a GPU `has_gpu` does not know.
pub fn check_owner(
    checkpoint: &Checkpoint,
    node: &str,
    pool: &str,
    has_gpu: impl Fn(&str) -> bool,
) -> Result<(), CheckpointError> {
    if checkpoint.node_name.is_empty() {
        let mut gpus: Vec<String> = checkpoint
            .claims
            .values()
            .flat_map(|record| &record.devices)
            .map(|device| device.target.gpu_uuid())
            .filter(|uuid| !has_gpu(uuid))
            .map(str::to_owned)
            .collect();
        gpus.sort();
        gpus.dedup();
        return if gpus.is_empty() {
            Ok(())
        } else {
            Err(CheckpointError::ForeignGpus { gpus })
        };
    }
    if checkpoint.node_name != node || checkpoint.pool_name != pool {
        return Err(CheckpointError::ForeignNode {
            node: checkpoint.node_name.clone(),
            pool: checkpoint.pool_name.clone(),
            this_node: node.to_owned(),
            this_pool: pool.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use tessera_api::config::{MpsConfig, SharingStrategy};

    fn sample() -> Checkpoint {
        let mut claims = BTreeMap::new();
        claims.insert(
            ClaimUid::new("uid-1"),
            ClaimRecord {
                namespace: "default".into(),
                name: "gpu".into(),
                state: ClaimState::PrepareCompleted,
                devices: vec![DeviceRecord {
                    request: "gpu".into(),
                    pool: "node-a".into(),
                    device: "gpu-0".into(),
                    cdi_device_ids: vec!["gpu.tessera.dev/claim=uid-1-gpu-0".into()],
                    target: DeviceTarget::Gpu {
                        uuid: "GPU-0".into(),
                        minor: 0,
                    },
                    sharing: Some(Sharing {
                        strategy: SharingStrategy::Mps,
                        time_slicing: None,
                        mps: Some(MpsConfig {
                            default_active_thread_percentage: Some(50),
                            ..MpsConfig::default()
                        }),
                    }),
                    share: None,
                }],
                mps: Some(MpsRecord {
                    pipe_directory: "/var/lib/tessera/mps/uid-1/pipe".into(),
                    log_directory: "/var/lib/tessera/mps/uid-1/log".into(),
                }),
                imex: None,
            },
        );
        claims.insert(
            ClaimUid::new("uid-2"),
            ClaimRecord {
                namespace: "ml".into(),
                name: "slice".into(),
                state: ClaimState::PrepareStarted,
                devices: vec![DeviceRecord {
                    request: "mig/small".into(),
                    pool: "node-a".into(),
                    device: "gpu-3-mig-1g-10gb-3".into(),
                    cdi_device_ids: vec![],
                    target: DeviceTarget::Mig {
                        parent_uuid: "GPU-3".into(),
                        parent_minor: 3,
                        profile: "1g.10gb".into(),
                        placement_start: 3,
                        lifecycle: MigLifecycle::Dynamic,
                        instance: Some(MigInstanceRecord {
                            uuid: "MIG-9".into(),
                            gpu_instance_id: 9,
                            compute_instance_id: 0,
                        }),
                    },
                    sharing: None,
                    share: Some(DeviceShare {
                        share_id: "4d1c0000-0000-4000-8000-000000000003".into(),
                        memory_bytes: Some(10 << 30),
                        shares: Some(1),
                        total_shares: Some(4),
                    }),
                }],
                mps: None,
                imex: None,
            },
        );
        Checkpoint {
            boot_id: "b0a7c0de-0000-4000-8000-000000000000".into(),
            node_name: "node-a".into(),
            pool_name: "node-a".into(),
            claims,
        }
    }

    /// The file today's checkpoint would have been as version 1 (no node and pool).
    fn encode_v1(checkpoint: &Checkpoint) -> Vec<u8> {
        let v1 = Checkpoint {
            node_name: String::new(),
            pool_name: String::new(),
            ..checkpoint.clone()
        };
        let text = String::from_utf8(encode(&v1)).unwrap();
        text.replace("\"version\": 2", "\"version\": 1")
            .into_bytes()
    }

    #[test]
    fn version_1_is_read_without_its_owner_and_checked_by_its_gpus() {
        let today = sample();
        let v1 = decode(&encode_v1(&today)).unwrap();
        assert_eq!(v1.node_name, "");
        assert_eq!(v1.claims, today.claims);
        // Its node is unknown: it is this node's if every GPU it names is.
        let ours = |uuid: &str| ["GPU-0", "GPU-3"].contains(&uuid);
        assert_eq!(check_owner(&v1, "node-a", "node-a", ours), Ok(()));
        let err = check_owner(&v1, "node-a", "node-a", |uuid| uuid == "GPU-0").unwrap_err();
        assert_eq!(
            err,
            CheckpointError::ForeignGpus {
                gpus: vec!["GPU-3".into()]
            }
        );
        assert!(
            err.to_string().contains("copied from another node"),
            "{err}"
        );
        // Version 2 names its owner.
        assert_eq!(check_owner(&today, "node-a", "node-a", |_| false), Ok(()));
        let err = check_owner(&today, "node-b", "node-b", |_| true).unwrap_err();
        assert!(
            err.to_string()
                .contains("belongs to node `node-a` (pool `node-a`), not to this node `node-b`"),
            "{err}"
        );
        // Each version has exactly its own fields.
        let text = String::from_utf8(encode(&today)).unwrap();
        let no_owner = text.replace("\"version\": 2", "\"version\": 1");
        assert!(decode(no_owner.as_bytes()).is_err());
        let v1_text = String::from_utf8(encode_v1(&today)).unwrap();
        let as_v2 = v1_text.replace("\"version\": 1", "\"version\": 2");
        let err = decode(as_v2.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("required in version 2"), "{err}");
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let checkpoint = sample();
        let bytes = encode(&checkpoint);
        assert_eq!(decode(&bytes).unwrap(), checkpoint);
        assert_eq!(encode(&decode(&bytes).unwrap()), bytes);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"version\": 2"), "{text}");
        assert!(text.contains("\"nodeName\": \"node-a\""), "{text}");
        assert!(text.contains("\"checksum\": \"sha256:"), "{text}");
        assert!(text.contains("\"state\": \"PrepareStarted\""), "{text}");
        assert!(text.contains("\"type\": \"mig\""), "{text}");
    }

    #[test]
    fn empty_checkpoint_round_trips() {
        let checkpoint = Checkpoint {
            boot_id: "b".into(),
            node_name: "n".into(),
            pool_name: "n".into(),
            claims: BTreeMap::new(),
        };
        assert_eq!(decode(&encode(&checkpoint)).unwrap(), checkpoint);
    }

    #[test]
    fn a_changed_payload_fails_the_checksum() {
        let text = String::from_utf8(encode(&sample())).unwrap();
        let edited = text.replace("\"gpu-0\"", "\"gpu-1\"");
        assert_ne!(edited, text);
        let err = decode(edited.as_bytes()).unwrap_err();
        assert!(
            matches!(err, CheckpointError::ChecksumMismatch { .. }),
            "{err}"
        );
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let good = String::from_utf8(encode(&sample())).unwrap();
        let cases: Vec<(String, &str)> = vec![
            ("".into(), "cannot be parsed"),
            ("{\"version\": 2, \"checks".into(), "cannot be parsed"),
            ("[1, 2]".into(), "not a JSON object"),
            ("{\"checksum\": \"x\"}".into(), "`version` is missing"),
            (
                good.replace("\"version\": 2", "\"version\": 3"),
                "version 3",
            ),
            (
                good.replace("\"version\": 2", "\"version\": \"2\""),
                "version \"2\"",
            ),
            (
                good.replace("\"bootId\"", "\"bootID\""),
                "field `checkpoint.bootID`",
            ),
            (
                good.replace("\"PrepareStarted\"", "\"Preparing\""),
                "field `checkpoint.claims.uid-2.state`",
            ),
            (good.replace("\"checksum\"", "\"sum\""), "unknown field"),
        ];
        for (text, want) in cases {
            let err = decode(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: `{err}` lacks `{want}`");
        }
    }

    #[test]
    fn target_accessors() {
        let checkpoint = sample();
        let gpu = &checkpoint.claims[&ClaimUid::new("uid-1")].devices[0].target;
        assert_eq!(gpu.visible_uuid(), Some("GPU-0"));
        assert_eq!(gpu.gpu_minor(), 0);
        let mig = &checkpoint.claims[&ClaimUid::new("uid-2")].devices[0].target;
        assert_eq!(mig.visible_uuid(), Some("MIG-9"));
        assert_eq!(mig.gpu_uuid(), "GPU-3");
        assert_eq!(mig.gpu_minor(), 3);
    }
}
