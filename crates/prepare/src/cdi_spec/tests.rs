use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_kubelet_grpc::ClaimRef;

use super::*;
use crate::checkpoint::{ClaimRecord, DeviceTarget, MigInstanceRecord};
use crate::injection::DriverInjection;
use crate::plan::{MigMode, PlanContext, plan_claim};

const UID: &str = "4f7c2a10-0000-4000-8000-00000000000a";

fn planned_in(
    mode: MigMode,
    results: serde_json::Value,
    configs: serde_json::Value,
) -> ClaimRecord {
    let inventory = MockSource::new("hgx-a100-mig")
        .unwrap()
        .inventory()
        .unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"namespace": "ml", "name": "c", "uid": UID},
        "status": {"allocation": {"devices": {"results": results, "config": configs}}},
    }))
    .unwrap();
    plan_claim(
        &claim,
        &ClaimRef::new("ml", "c", UID),
        PlanContext {
            node_name: "node-a",
            inventory: &inventory,
            mig_mode: mode,
            mps_root: Path::new("/var/lib/tessera/mps"),
            total_shares: None,
            imex_root: Path::new("/var/lib/tessera/imex"),
        },
    )
    .unwrap()
}

fn planned(results: serde_json::Value, configs: serde_json::Value) -> ClaimRecord {
    planned_in(MigMode::Dynamic, results, configs)
}

fn result(request: &str, device: &str) -> serde_json::Value {
    json!({"request": request, "driver": "gpu.tessera.dev", "pool": "node-a", "device": device})
}

/// Gives every dynamic MIG device of `record` an instance, as prepare does before the spec.
fn created(mut record: ClaimRecord) -> ClaimRecord {
    for (n, device) in record.devices.iter_mut().enumerate() {
        if let DeviceTarget::Mig { instance, .. } = &mut device.target
            && instance.is_none()
        {
            *instance = Some(MigInstanceRecord {
                uuid: format!("MIG-00000000-0000-4000-8000-00000000000{n}"),
                gpu_instance_id: 5,
                compute_instance_id: 0,
            });
        }
    }
    record
}

#[test]
fn kind_and_ids() {
    assert_eq!(kind().to_string(), "gpu.tessera.dev/claim");
    assert_eq!(
        device_id(UID, "gpu-0"),
        format!("gpu.tessera.dev/claim={UID}-gpu-0")
    );
    assert_eq!(
        kind()
            .device_id(&device_name(UID, "gpu-0"))
            .unwrap()
            .to_string(),
        device_id(UID, "gpu-0")
    );
}

#[test]
fn whole_gpus_mig_and_mps() {
    // gpu-6 and gpu-7 (request `gpus`, MPS), and a dynamic MIG device on minor 1 (request `mig`).
    let record = created(planned(
        json!([
            result("gpus", "gpu-6"),
            result("gpus", "gpu-7"),
            result("mig", "gpu-1-mig-1g-10gb-3"),
        ]),
        json!([{"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": "gpu.tessera.dev",
            "parameters": {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
                           "sharing": {"strategy": "MPS"}}}}]),
    ));
    let spec = claim_spec(
        UID,
        &record,
        &MigCapMinors::standard(),
        &DriverInjection::none(),
    )
    .unwrap();
    spec.validate().unwrap();
    insta::assert_json_snapshot!(spec);
}

#[test]
fn static_mig_uses_the_listed_capabilities() {
    // minor 3, 1g.10gb at placement 2 is GPU instance 9, compute instance 0.
    let record = planned_in(
        MigMode::Static,
        json!([result("mig", "gpu-3-mig-1g-10gb-2")]),
        json!([]),
    );
    let caps = MigCapMinors::parse("gpu3/gi9/access 300\ngpu3/gi9/ci0/access 301\n");
    let spec = claim_spec(UID, &record, &caps, &DriverInjection::none()).unwrap();
    let device = &spec.devices[0];
    let paths: Vec<&str> = device
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(
        paths,
        vec![
            "/dev/nvidia3",
            "/dev/nvidia-caps/nvidia-cap300",
            "/dev/nvidia-caps/nvidia-cap301"
        ]
    );
    // Which MIG device CUDA sees follows from the capability nodes; no variable narrows it.
    assert!(
        device
            .container_edits
            .env
            .iter()
            .all(|e| !e.contains("VISIBLE_DEVICES")),
        "{:?}",
        device.container_edits.env
    );
    assert_eq!(spec.container_edits.env, vec![VISIBLE_DEVICES_VOID]);
    let err = claim_spec(
        UID,
        &record,
        &MigCapMinors::parse(""),
        &DriverInjection::none(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("no nvidia-caps device for GPU instance 9"),
        "{err}"
    );
}

#[test]
fn an_uncreated_mig_device_has_no_spec() {
    let record = planned(json!([result("mig", "gpu-1-mig-1g-10gb-3")]), json!([]));
    let err = claim_spec(
        UID,
        &record,
        &MigCapMinors::standard(),
        &DriverInjection::none(),
    )
    .unwrap_err();
    assert!(matches!(err, CdiSpecError::NoMigInstance { .. }), "{err}");
}

#[test]
fn a_driver_root_adds_its_files_and_takes_device_nodes_from_the_device_root() {
    use tessera_driver_root::discover::{DriverFiles, Library};
    use tessera_driver_root::edits::{Injection, driver_edits};
    let files = DriverFiles {
        version: "580.159.04".into(),
        version_from: "/lib64/libcuda.so.580.159.04".into(),
        libraries: vec![Library {
            path: "/lib64/libcuda.so.580.159.04".into(),
            aliases: vec!["libcuda.so.1".into(), "libcuda.so".into()],
        }],
        from_loader_cache: false,
        binaries: Vec::new(),
        firmware: Vec::new(),
        ipc_sockets: Vec::new(),
    };
    let dev_root = std::path::PathBuf::from("/var/lib/mock/dev-root");
    let injection = DriverInjection {
        edits: driver_edits(
            &files,
            &Injection {
                driver_root: "/home/kubernetes/bin/nvidia".into(),
                dev_root: dev_root.clone(),
                hook: Some("/var/lib/kubelet/plugins/gpu.tessera.dev/tessera-cdi-hook".into()),
            },
        ),
        control_nodes: vec![tessera_driver_root::edits::device_node(
            "/dev/nvidiactl",
            &dev_root,
        )],
        dev_root,
    };
    let record = planned_in(
        MigMode::Static,
        json!([result("mig", "gpu-3-mig-1g-10gb-2")]),
        json!([]),
    );
    let caps = MigCapMinors::parse("gpu3/gi9/access 300\ngpu3/gi9/ci0/access 301\n");
    let spec = claim_spec(UID, &record, &caps, &injection).unwrap();
    spec.validate().unwrap();
    assert_eq!(spec.cdi_version.as_str(), "0.5.0");
    assert_eq!(
        spec.container_edits.mounts.len(),
        3,
        "the file under its three names"
    );
    assert_eq!(spec.container_edits.hooks.len(), 1);
    assert_eq!(
        spec.container_edits.device_nodes[0].host_path.as_deref(),
        Some("/var/lib/mock/dev-root/dev/nvidiactl")
    );
    let nodes: Vec<(&str, Option<&str>)> = spec.devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.host_path.as_deref()))
        .collect();
    assert_eq!(
        nodes,
        vec![
            ("/dev/nvidia3", Some("/var/lib/mock/dev-root/dev/nvidia3")),
            (
                "/dev/nvidia-caps/nvidia-cap300",
                Some("/var/lib/mock/dev-root/dev/nvidia-caps/nvidia-cap300")
            ),
            (
                "/dev/nvidia-caps/nvidia-cap301",
                Some("/var/lib/mock/dev-root/dev/nvidia-caps/nvidia-cap301")
            ),
        ]
    );
}

/// The environment a runtime gives a container from the CDI edits of `specs` applied in order:
/// spec-level edits, then each device's; a later value of a name replaces an earlier one.
fn applied_env(specs: &[&Spec]) -> std::collections::BTreeMap<String, String> {
    let mut env = std::collections::BTreeMap::new();
    for spec in specs {
        let edits = std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits));
        for entry in edits.flat_map(|e| e.env.iter()) {
            let (name, value) = entry.split_once('=').unwrap();
            env.insert(name.to_owned(), value.to_owned());
        }
    }
    env
}

#[test]
fn a_container_with_two_claims_is_not_narrowed_to_the_last_claims_gpus() {
    let first = planned(json!([result("gpu", "gpu-6")]), json!([]));
    let second = planned(json!([result("gpu", "gpu-7")]), json!([]));
    let injection = DriverInjection::none();
    let caps = MigCapMinors::standard();
    let a = claim_spec(UID, &first, &caps, &injection).unwrap();
    let b = claim_spec(
        "4f7c2a10-0000-4000-8000-00000000000b",
        &second,
        &caps,
        &injection,
    )
    .unwrap();
    for order in [[&a, &b], [&b, &a]] {
        let env = applied_env(&order);
        // CUDA enumerates the device nodes the container got: both claims' GPUs.
        assert_eq!(env.get("CUDA_VISIBLE_DEVICES"), None, "{env:?}");
        assert_eq!(
            env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
            Some("void")
        );
    }
    let nodes: Vec<&str> = [&a, &b]
        .iter()
        .flat_map(|s| s.devices.iter())
        .flat_map(|d| d.container_edits.device_nodes.iter())
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(nodes, vec!["/dev/nvidia6", "/dev/nvidia7"]);
}
