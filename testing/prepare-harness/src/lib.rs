//! Test-only (a dev-dependency, never shipped): the claim-preparation driver on fakes
//! ([`Harness`]: claims in memory, recording GPU and IMEX controls, simulated MIG, temporary CDI and
//! state directories, an injectable boot id) and the allocated claims its tests are made of.
//!
//! A crate of its own so that the prepare core's tests and the node plugin's tests (which run
//! the driver behind the kubelet's gRPC, against the API-server fake, through NVML or as the
//! plugin binary) share one copy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::ClaimRef;
use tessera_prepare::checkpoint::{self, Checkpoint};
use tessera_prepare::claims::{ClaimSource, InMemoryClaims};
use tessera_prepare::imex::RecordingImexControl;
use tessera_prepare::inventory::NodeInventory;
use tessera_prepare::mig::SimulatedMig;
use tessera_prepare::plan::MigMode;
use tessera_prepare::sharing::RecordingGpuControl;
use tessera_prepare::{DriverParts, NodeDriver, NodeDriverConfig, StartupReport};

pub const NODE: &str = "node-a";

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub topology: &'static str,
    pub inventory: GpuInventory,
    pub claims: Arc<InMemoryClaims>,
    pub gpu: Arc<RecordingGpuControl>,
    pub mig: Arc<SimulatedMig>,
    pub imex: Arc<RecordingImexControl>,
    pub config: NodeDriverConfig,
}

impl Harness {
    pub fn new(topology: &'static str, mig_mode: MigMode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let inventory = MockSource::new(topology).unwrap().inventory().unwrap();
        let boot_id = dir.path().join("boot_id");
        std::fs::write(&boot_id, "boot-1\n").unwrap();
        let config = NodeDriverConfig::new(NODE, dir.path().join("cdi"), dir.path().join("state"))
            .mig_mode(mig_mode)
            .boot_id_path(boot_id)
            .mig_minors_path(dir.path().join("no-mig-minors"));
        Self {
            topology,
            claims: Arc::new(InMemoryClaims::new()),
            gpu: Arc::new(RecordingGpuControl::new()),
            mig: Arc::new(SimulatedMig::in_memory(&inventory)),
            imex: Arc::new(RecordingImexControl::new()),
            inventory,
            config,
            dir,
        }
    }

    pub fn parts(&self) -> DriverParts {
        self.parts_with(self.claims.clone())
    }

    /// The parts, reading claims from `claims` instead of the in-memory store.
    pub fn parts_with(&self, claims: Arc<dyn ClaimSource>) -> DriverParts {
        DriverParts {
            inventory: Arc::new(
                NodeInventory::read(Arc::new(MockSource::new(self.topology).unwrap())).unwrap(),
            ),
            claims,
            gpu: self.gpu.clone(),
            mig: self.mig.clone(),
            imex: self.imex.clone(),
        }
    }

    pub async fn start(&self) -> (NodeDriver, StartupReport) {
        NodeDriver::start(self.config.clone(), self.parts())
            .await
            .expect("the driver starts")
    }

    pub fn set_boot_id(&self, id: &str) {
        std::fs::write(&self.config.boot_id_path, format!("{id}\n")).unwrap();
    }

    pub fn cdi_dir(&self) -> &Path {
        &self.config.cdi_root
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.config.state_dir.join("checkpoint.json")
    }

    pub fn read_checkpoint(&self) -> Checkpoint {
        checkpoint::decode(&std::fs::read(self.checkpoint_path()).unwrap()).unwrap()
    }

    pub fn write_checkpoint(&self, checkpoint: &Checkpoint) {
        std::fs::write(self.checkpoint_path(), checkpoint::encode(checkpoint)).unwrap();
    }

    /// The claim UIDs that have a CDI spec.
    pub fn spec_uids(&self) -> Vec<String> {
        let mut uids: Vec<String> = std::fs::read_dir(self.cdi_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("gpu.tessera.dev-claim_")?
                    .strip_suffix(".json")
                    .map(str::to_owned)
            })
            .collect();
        uids.sort();
        uids
    }

    pub fn spec(&self, uid: &str) -> Value {
        let path = self
            .cdi_dir()
            .join(format!("gpu.tessera.dev-claim_{uid}.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// Stores an allocated, reserved claim and returns the reference the kubelet would send.
    pub fn claim(&self, name: &str, results: &[(&str, &str)], configs: Vec<Value>) -> ClaimRef {
        let claim = allocated_claim(name, results, configs);
        let reference = ClaimRef::new("ml", name, uid_of(name));
        self.claims.put(claim);
        reference
    }

    /// Stores a claim holding IMEX channel `channel` of the clique of this node and `node-b`
    /// (one domain), reserved for one pod, and returns its reference.
    pub fn channel_claim(&self, name: &str, channel: u32) -> ClaimRef {
        let claim = channel_claim(name, &[channel]);
        let reference = ClaimRef::new("ml", name, uid_of(name));
        self.claims.put(claim);
        reference
    }

    pub fn gpu_uuid(&self, minor: u32) -> String {
        self.inventory.gpu_by_minor(minor).unwrap().uuid.clone()
    }
}

/// A stable UID for a claim name (FNV-1a of the name).
pub fn uid_of(name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("c1a1d000-0000-4000-8000-{:012x}", hash & 0xffff_ffff_ffff)
}

pub fn allocated_claim(name: &str, results: &[(&str, &str)], configs: Vec<Value>) -> ResourceClaim {
    let results: Vec<Value> = results
        .iter()
        .map(|(request, device)| {
            json!({"request": request, "driver": "gpu.tessera.dev", "pool": NODE, "device": device})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "ml", "name": name, "uid": uid_of(name)},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": results, "config": configs}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": "p0d"}],
        },
    }))
    .unwrap()
}

/// The clique of [`channel_claim`]'s channels.
pub const CLIQUE: &str = "522c88f3-2731-5718-acd9-980cbf3d0f20.32766";

/// A claim allocated `channels` of [`CLIQUE`]'s pool, network-attached to this node and `node-b`
/// (as the controller publishes them).
pub fn channel_claim(name: &str, channels: &[u32]) -> ResourceClaim {
    let results: Vec<Value> = channels
        .iter()
        .map(|c| {
            json!({"request": "channel", "driver": "gpu.tessera.dev",
                "pool": format!("imex-{CLIQUE}"), "device": format!("channel-{c}")})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "ml", "name": name, "uid": uid_of(name)},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE, "node-b"]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": "p0d"}],
        },
    }))
    .unwrap()
}

/// A claim config entry carrying a Tessera opaque config.
pub fn claim_config(requests: &[&str], kind: &str, sharing: Value) -> Value {
    json!({"source": "FromClaim", "requests": requests, "opaque": {"driver": "gpu.tessera.dev",
        "parameters": {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": kind, "sharing": sharing}}})
}

/// The `NAME=value` env entries of a spec device.
pub fn env_of(spec: &Value, device: usize) -> Vec<String> {
    spec["devices"][device]["containerEdits"]["env"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// The device node paths of a spec device.
pub fn nodes_of(spec: &Value, device: usize) -> Vec<String> {
    spec["devices"][device]["containerEdits"]["deviceNodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v["path"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
