//! Dynamic MIG through the real NVML code path: the driver's inventory and MIG control are an
//! `NvmlSource` on fake-nvml, claims come from the API-server fake, calls from the kubelet
//! simulator. NVML state is per process, so the test body runs in a child process.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use serde_json::json;
use tessera_api::DRIVER_NAME;
use tessera_fake_apiserver::FakeApiServer;
use tessera_fake_nvml::{LIBRARY_FILE_NAME, TOPOLOGY_ENV};
use tessera_gpu_inventory::model::MigInstance;
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_kubelet_grpc::{ClaimRef, PluginConfig};
use tessera_node::backend::NvmlMig;
use tessera_node::claims::KubeClaimSource;
use tessera_nvml::NvmlSource;
use tessera_prepare::mig::MigCapMinors;
use tessera_prepare::plan::MigMode;
use tessera_prepare::{DriverParts, NodeDriver};
use tessera_prepare_harness::{Harness, allocated_claim, claim_config, env_of, nodes_of, uid_of};

const CHILD_ENV: &str = "TESSERA_NODE_TEST_CHILD";

/// The fake NVML library cargo built next to this test executable.
fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join(LIBRARY_FILE_NAME),
        deps.join("..").join(LIBRARY_FILE_NAME),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("{LIBRARY_FILE_NAME} is not next to {}", exe.display()))
}

/// Runs test `test` of this executable again in a child process with `env`.
fn run_in_child(test: &str, env: &[(&str, &str)]) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child `{test}` failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn dynamic_mig_devices_are_created_and_destroyed_through_nvml() {
    const TEST: &str = "dynamic_mig_devices_are_created_and_destroyed_through_nvml";
    if std::env::var(CHILD_ENV).as_deref() != Ok(TEST) {
        return run_in_child(TEST, &[(TOPOLOGY_ENV, "hgx-a100-mig")]);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(child());
}

/// An API server holding claim "dynamic": a 1g.10gb and an MPS-shared 3g.40gb MIG device of GPU 1,
/// neither of which exists yet.
fn api_with_a_dynamic_claim() -> FakeApiServer {
    let api = FakeApiServer::new();
    api.seed(&allocated_claim(
        "dynamic",
        &[
            ("small", "gpu-1-mig-1g-10gb-3"),
            ("big", "gpu-1-mig-3g-40gb-4"),
        ],
        vec![claim_config(
            &["big"],
            "MigDeviceConfig",
            json!({"strategy": "MPS"}),
        )],
    ));
    api
}

/// The claim's spec gives each instance its GPU's and its own capability device nodes.
fn assert_the_spec_names_the_instances(
    h: &Harness,
    claim: &ClaimRef,
    small: &MigInstance,
    big: &MigInstance,
) {
    let spec = h.spec(claim.uid.as_str());
    let caps = MigCapMinors::standard();
    // CUDA sees a MIG device through its capability nodes, not a variable.
    assert!(
        env_of(&spec, 0)
            .iter()
            .all(|e| !e.contains("VISIBLE_DEVICES"))
    );
    assert_eq!(
        nodes_of(&spec, 0)[1..],
        [
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                caps.gpu_instance(1, small.gpu_instance_id).unwrap()
            ),
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                caps.compute_instance(1, small.gpu_instance_id, small.compute_instance_id)
                    .unwrap()
            ),
        ]
    );
    assert_eq!(
        nodes_of(&spec, 1),
        vec![
            "/dev/nvidia1".to_owned(),
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                caps.gpu_instance(1, big.gpu_instance_id).unwrap()
            ),
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                caps.compute_instance(1, big.gpu_instance_id, big.compute_instance_id)
                    .unwrap()
            ),
        ]
    );
}

async fn child() {
    let h = Harness::new("hgx-a100-mig", MigMode::Dynamic);
    let minors = h.dir.path().join("mig-minors");
    std::fs::write(&minors, MigCapMinors::standard_file_text(8)).unwrap();
    let config = h.config.clone().mig_minors_path(&minors);
    let nvml = Arc::new(NvmlSource::open(Some(&fake_library())).unwrap());
    let gpu = h.gpu_uuid(1);
    let existing = nvml.mig_devices(&gpu).unwrap();
    assert!(
        !existing.is_empty(),
        "the topology has MIG devices on minor 1"
    );

    let api = api_with_a_dynamic_claim();
    let claim = ClaimRef::new("ml", "dynamic", uid_of("dynamic"));
    let parts = DriverParts {
        inventory: Arc::new(tessera_prepare::inventory::NodeInventory::read(nvml.clone()).unwrap()),
        claims: Arc::new(KubeClaimSource::new(api.client())),
        gpu: h.gpu.clone(),
        mig: Arc::new(NvmlMig(nvml.clone())),
        imex: Arc::new(tessera_prepare::imex::NoImex),
    };

    let (driver, report) = NodeDriver::start(config.clone(), parts.clone())
        .await
        .unwrap();
    // Dynamic MIG owns the GPUs' instances: the pre-existing ones are gone.
    for instance in &existing {
        assert!(report.destroyed_mig.contains(&instance.uuid), "{report:?}");
    }
    assert!(nvml.mig_devices(&gpu).unwrap().is_empty());

    let kubelet_root = tempfile::tempdir().unwrap();
    let plugin = PluginConfig::new(DRIVER_NAME)
        .registrar_dir(kubelet_root.path().join("registry"))
        .plugins_dir(kubelet_root.path().join("plugins"))
        .bind(Arc::new(driver))
        .unwrap();
    let registration = plugin.socket_paths().registration.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(plugin.serve(async {
        let _ = stopped.await;
    }));
    let kubelet = KubeletSimulator::register(&registration).await.unwrap();

    let devices = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap()[&claim.uid]
        .clone()
        .unwrap();
    assert_eq!(devices.len(), 2);
    let created = nvml.mig_devices(&gpu).unwrap();
    let at = |start: u32| created.iter().find(|i| i.placement_start == start).unwrap();
    let (small, big) = (at(3), at(4));
    assert_eq!(
        (small.profile.as_str(), big.profile.as_str()),
        ("1g.10gb", "3g.40gb")
    );
    assert_the_spec_names_the_instances(&h, &claim, small, big);
    let daemons = h.gpu.running_daemons();
    assert_eq!(daemons.len(), 1);
    assert_eq!(
        daemons[0].devices[0].uuid, big.uuid,
        "MPS serves the MIG device"
    );
    let _ = stop.send(());
    serving.await.unwrap().unwrap();

    // A restart in the same boot keeps the instances (the fake's state is the "hardware").
    let (driver, report) = NodeDriver::start(config, parts).await.unwrap();
    assert!(report.destroyed_mig.is_empty(), "{report:?}");
    assert_eq!(nvml.mig_devices(&gpu).unwrap(), created);

    use tessera_kubelet_grpc::DraDriver;
    driver.unprepare(vec![claim.clone()]).await[&claim.uid]
        .clone()
        .unwrap();
    assert!(nvml.mig_devices(&gpu).unwrap().is_empty());
    assert!(h.spec_uids().is_empty());
    assert!(h.gpu.running_daemons().is_empty());
}
