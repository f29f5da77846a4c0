//! The node driver served to the kubelet simulator over real unix sockets, reading claims from
//! the API-server fake through kube: registration, NodePrepareResources /
//! NodeUnprepareResources over `v1` and `v1beta1`, CDI spec contents, per-claim errors.

mod support;

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use tessera_api::DRIVER_NAME;
use tessera_api::config::TimeSliceInterval;
use tessera_fake_apiserver::{FakeApiServer, Verb};
use tessera_kubelet_grpc::simulator::{DraApiVersion, KubeletSimulator};
use tessera_kubelet_grpc::{ClaimRef, PluginConfig, ServeError};
use tessera_node::claims::KubeClaimSource;
use tessera_prepare::NodeDriver;
use tessera_prepare::plan::MigMode;
use tessera_prepare_harness::{Harness, allocated_claim, claim_config, env_of, nodes_of, uid_of};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A driver served on a temporary kubelet directory, registered with the simulator.
pub struct Served {
    pub kubelet: KubeletSimulator,
    stop: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Served {
    pub async fn start(driver: NodeDriver, kubelet_root: &Path) -> Self {
        let plugin = PluginConfig::new(DRIVER_NAME)
            .registrar_dir(kubelet_root.join("plugins_registry"))
            .plugins_dir(kubelet_root.join("plugins"))
            .serialize_calls(false)
            .bind(Arc::new(driver))
            .unwrap();
        let registration = plugin.socket_paths().registration.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(plugin.serve(async {
            let _ = stopped.await;
        }));
        let kubelet = KubeletSimulator::register(&registration).await.unwrap();
        Self {
            kubelet,
            stop: Some(stop),
            serving: Some(serving),
        }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.serving.take().unwrap().await.unwrap().unwrap();
    }
}

fn class_config(requests: &[&str], kind: &str, sharing: Value) -> Value {
    let mut config = claim_config(requests, kind, sharing);
    config["source"] = json!("FromClass");
    config
}

/// Seeds the claims of [`kubelet_prepares_and_unprepares_claims_served_by_the_api_server`]: three
/// good ones (time-sliced, MPS, static MIG), then one bad for each reason (not allocated,
/// re-created under another UID, an unknown device, an invalid config).
fn seed_claims(api: &FakeApiServer) -> [ClaimRef; 7] {
    let seed = |name: &str, results: &[(&str, &str)], configs: Vec<Value>| {
        api.seed(&allocated_claim(name, results, configs));
        ClaimRef::new("ml", name, uid_of(name))
    };
    // A whole GPU, time-sliced by its DeviceClass's config, asked for through a subrequest.
    let sliced = seed(
        "sliced",
        &[("gpu/big", "gpu-6")],
        vec![class_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        )],
    );
    // Two whole GPUs shared with MPS.
    let mps = seed(
        "mps",
        &[("gpus", "gpu-4"), ("gpus", "gpu-5")],
        vec![claim_config(
            &["gpus"],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}}),
        )],
    );
    // A static MIG device (minor 3, 1g.10gb at slice 2), also with MPS.
    let mig = seed(
        "static-mig",
        &[("mig", "gpu-3-mig-1g-10gb-2")],
        vec![claim_config(
            &[],
            "MigDeviceConfig",
            json!({"strategy": "MPS"}),
        )],
    );
    // Bad input, one problem each.
    let mut unallocated_claim = allocated_claim("unallocated", &[], vec![]);
    unallocated_claim.status = None;
    api.seed(&unallocated_claim);
    let unallocated = ClaimRef::new("ml", "unallocated", uid_of("unallocated"));
    let recreated = ClaimRef::new("ml", "sliced", "00000000-0000-4000-8000-0000000000aa");
    let unknown = seed("unknown", &[("gpu", "gpu-42")], vec![]);
    let invalid = seed(
        "invalid",
        &[("gpu", "gpu-7")],
        vec![claim_config(
            &[],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"pinned": "1Gi"}}),
        )],
    );
    [sliced, mps, mig, unallocated, recreated, unknown, invalid]
}

/// The MPS claim's spec: each GPU's device node, the daemon's pipe mounted; one daemon
/// per claim runs (this one's and the MIG claim's).
fn assert_mps_claim_spec(h: &Harness, mps: &ClaimRef) {
    let spec = h.spec(mps.uid.as_str());
    for device in 0..2 {
        let env = env_of(&spec, device);
        assert!(
            env.iter().all(|e| !e.contains("VISIBLE_DEVICES")),
            "{env:?}"
        );
        assert!(env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_owned()));
    }
    assert_eq!(nodes_of(&spec, 0), vec!["/dev/nvidia4"]);
    assert_eq!(nodes_of(&spec, 1), vec!["/dev/nvidia5"]);
    assert_eq!(
        spec["devices"][1]["containerEdits"]["mounts"][0]["containerPath"],
        "/tmp/nvidia-mps"
    );
    let daemons = h.gpu.running_daemons();
    assert_eq!(daemons.len(), 2, "one MPS daemon per claim: {daemons:?}");
}

/// The static MIG claim's spec: its GPU and capability device nodes (what CUDA enumerates by).
fn assert_static_mig_claim_spec(h: &Harness, mig: &ClaimRef) {
    let spec = h.spec(mig.uid.as_str());
    assert_eq!(
        spec["containerEdits"]["env"],
        json!(["NVIDIA_VISIBLE_DEVICES=void"])
    );
    // Standard nvidia-caps layout: GPU minor 3, GPU instance 9, compute instance 0.
    assert_eq!(
        nodes_of(&spec, 0),
        vec![
            "/dev/nvidia3",
            "/dev/nvidia-caps/nvidia-cap489",
            "/dev/nvidia-caps/nvidia-cap490"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_prepares_and_unprepares_claims_served_by_the_api_server() {
    let h = Harness::new("hgx-a100-mig", MigMode::Static);
    let api = FakeApiServer::new();
    let [sliced, mps, mig, unallocated, recreated, unknown, invalid] = seed_claims(&api);

    let claims = Arc::new(KubeClaimSource::new(api.client()));
    let (driver, _) = NodeDriver::start(h.config.clone(), h.parts_with(claims))
        .await
        .unwrap();
    let kubelet_root = tempfile::tempdir().unwrap();
    let served = Served::start(driver, kubelet_root.path()).await;
    assert_eq!(served.kubelet.dra_version(), DraApiVersion::V1);

    let all = [
        &sliced,
        &mps,
        &mig,
        &unallocated,
        &recreated,
        &unknown,
        &invalid,
    ];
    let batch: Vec<ClaimRef> = all.iter().map(|c| (*c).clone()).collect();
    let results = served.kubelet.prepare(&batch).await.unwrap();
    assert_eq!(results.len(), all.len());

    // The good claims: devices, CDI ids, request names without the subrequest.
    let devices = results[&sliced.uid].clone().unwrap();
    assert_eq!(devices[0].request_names, vec!["gpu".to_owned()]);
    assert_eq!(devices[0].device_name, "gpu-6");
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![format!("gpu.tessera.dev/claim={}-gpu-6", sliced.uid)]
    );
    assert_eq!(h.gpu.time_slice(&h.gpu_uuid(6)), TimeSliceInterval::Long);

    assert_mps_claim_spec(&h, &mps);
    assert_static_mig_claim_spec(&h, &mig);

    // The bad ones: an error each, naming the claim and the problem.
    for (claim, want) in [
        (&unallocated, "not allocated"),
        (&recreated, "deleted and re-created"),
        (&unknown, "names device `gpu-42`"),
        (
            &invalid,
            "field `sharing.mps.pinned`: unknown field `pinned`",
        ),
    ] {
        let err = results[&claim.uid].clone().unwrap_err().to_string();
        assert!(err.contains(&format!("claim {claim}")), "{err}");
        assert!(err.contains(want), "{err} lacks {want}");
    }
    assert_eq!(h.spec_uids().len(), 3);

    // Preparing again (over v1beta1 this time) answers from the checkpoint: no API reads.
    api.clear_requests();
    let good = [sliced.clone(), mps.clone(), mig.clone()];
    let again = served
        .kubelet
        .prepare_with(DraApiVersion::V1beta1, &good)
        .await
        .unwrap();
    for claim in &good {
        assert_eq!(again[&claim.uid], results[&claim.uid]);
    }
    assert_eq!(api.request_count(Verb::Get, "resourceclaims"), 0);

    let unprepared = served.kubelet.unprepare(&batch).await.unwrap();
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    assert!(h.spec_uids().is_empty());
    assert!(h.gpu.running_daemons().is_empty());
    assert!(h.gpu.non_default_time_slices().is_empty());
    served.stop().await;
}
