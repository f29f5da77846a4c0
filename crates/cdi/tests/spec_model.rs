//! The spec model: exact JSON, round trips, version computation and validation.

use pretty_assertions::assert_eq;
use tessera_cdi::{
    CdiVersion, ContainerEdits, Device, DeviceNode, DeviceNodeType, Hook, HookName, Kind, Mount,
    Spec, SpecError,
};

fn kind() -> Kind {
    Kind::new("gpu.tessera.dev", "claim").unwrap()
}

fn gpu_device(name: &str) -> Device {
    Device {
        name: name.into(),
        container_edits: ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=GPU-6f3e0b4e-1c1d-4a52-8d1e-2b3c4d5e6f70".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: Some("/dev/nvidia0".into()),
                node_type: Some(DeviceNodeType::Char),
                major: Some(195),
                minor: Some(0),
                permissions: Some("rw".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
    }
}

/// A claim spec shaped like the node plugin's: one GPU, MPS edits at spec level.
fn claim_spec() -> Spec {
    let mut spec = Spec::new(kind(), vec![gpu_device("0b8e7c1a-gpu-0")]);
    spec.container_edits = ContainerEdits {
        env: vec!["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".into()],
        mounts: vec![Mount {
            host_path: "/var/run/tessera/mps/0b8e7c1a/pipe".into(),
            container_path: "/tmp/nvidia-mps".into(),
            options: vec!["rw".into(), "nosuid".into(), "bind".into()],
            mount_type: None,
        }],
        hooks: vec![Hook {
            hook_name: HookName::CreateContainer,
            path: "/usr/bin/nvidia-cdi-hook".into(),
            args: vec!["nvidia-cdi-hook".into(), "update-ldcache".into()],
            env: Vec::new(),
            timeout: Some(10),
        }],
        ..Default::default()
    };
    spec.set_minimum_version();
    spec
}

#[test]
fn a_claim_spec_serializes_to_the_json_the_runtime_reads_and_back() {
    let spec = claim_spec();
    let json = serde_json::to_value(&spec).unwrap();
    let expected = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "gpu.tessera.dev/claim",
        "devices": [{
            "name": "0b8e7c1a-gpu-0",
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=GPU-6f3e0b4e-1c1d-4a52-8d1e-2b3c4d5e6f70"],
                "deviceNodes": [{
                    "path": "/dev/nvidia0",
                    "hostPath": "/dev/nvidia0",
                    "type": "c",
                    "major": 195,
                    "minor": 0,
                    "permissions": "rw"
                }]
            }
        }],
        "containerEdits": {
            "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
            "hooks": [{
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache"],
                "timeout": 10
            }],
            "mounts": [{
                "hostPath": "/var/run/tessera/mps/0b8e7c1a/pipe",
                "containerPath": "/tmp/nvidia-mps",
                "options": ["rw", "nosuid", "bind"]
            }]
        }
    });
    assert_eq!(json, expected);
    let back: Spec = serde_json::from_value(json).unwrap();
    assert_eq!(back, spec);
    spec.validate().unwrap();
}

#[test]
fn the_declared_version_is_the_lowest_that_expresses_the_spec() {
    let plain = Device {
        name: "gpu-0".into(),
        container_edits: ContainerEdits {
            env: vec!["A=1".into()],
            ..Default::default()
        },
    };
    let spec_with = |kind: Kind, device: Device| Spec::new(kind, vec![device]).cdi_version;

    assert_eq!(spec_with(kind(), plain.clone()), CdiVersion::V0_3_0);
    let mut typed_mount = plain.clone();
    typed_mount.container_edits.mounts = vec![Mount {
        host_path: "/a".into(),
        container_path: "/b".into(),
        options: Vec::new(),
        mount_type: Some("bind".into()),
    }];
    assert_eq!(spec_with(kind(), typed_mount), CdiVersion::V0_4_0);
    let digit_first = Device {
        name: "0b8e-gpu-0".into(),
        ..plain.clone()
    };
    assert_eq!(spec_with(kind(), digit_first), CdiVersion::V0_5_0);
    assert_eq!(spec_with(kind(), gpu_device("gpu-0")), CdiVersion::V0_5_0);
    let dotted_class = Kind::new("gpu.tessera.dev", "claim.v2").unwrap();
    assert_eq!(spec_with(dotted_class, plain), CdiVersion::V0_6_0);
}

#[test]
fn versions_parse_with_or_without_v_and_unknown_ones_are_refused() {
    assert_eq!("0.5.0".parse::<CdiVersion>().unwrap(), CdiVersion::V0_5_0);
    assert_eq!("v1.0.0".parse::<CdiVersion>().unwrap(), CdiVersion::V1_0_0);
    assert!("0.9.0".parse::<CdiVersion>().is_err());
    assert!(CdiVersion::V0_3_0 < CdiVersion::V1_1_0);
    let unknown = serde_json::json!({"cdiVersion": "9.9.9", "kind": "a.b/c", "devices": []});
    let error = serde_json::from_value::<Spec>(unknown)
        .unwrap_err()
        .to_string();
    assert!(error.contains("9.9.9"), "{error}");
}

#[test]
fn unknown_fields_are_refused_like_the_runtime_does() {
    let mut json = serde_json::to_value(claim_spec()).unwrap();
    json["devices"][0]["containerEdits"]["deviceNodes"][0]["colour"] = "blue".into();
    let error = serde_json::from_value::<Spec>(json)
        .unwrap_err()
        .to_string();
    assert!(error.contains("colour"), "{error}");
}

#[test]
fn specs_the_runtime_would_reject_are_invalid() {
    fn invalid(change: impl FnOnce(&mut Spec)) -> SpecError {
        let mut spec = claim_spec();
        change(&mut spec);
        spec.validate().unwrap_err()
    }

    assert_eq!(invalid(|spec| spec.devices.clear()), SpecError::NoDevices);
    assert_eq!(
        invalid(|spec| spec.devices.push(spec.devices[0].clone())),
        SpecError::DuplicateDevice {
            name: "0b8e7c1a-gpu-0".into()
        }
    );
    assert!(matches!(
        invalid(|spec| spec.devices[0].name = "gpu/0".into()),
        SpecError::DeviceName(_)
    ));
    assert_eq!(
        invalid(|spec| spec.devices[0].container_edits = ContainerEdits::default()),
        SpecError::EmptyDevice {
            device: "0b8e7c1a-gpu-0".into()
        }
    );
    let error = invalid(|spec| spec.devices[0].container_edits.env.push("=x".into()));
    assert_eq!(
        error.to_string(),
        "device \"0b8e7c1a-gpu-0\": environment entry \"=x\" is not NAME=value"
    );
    assert!(matches!(
        invalid(|spec| spec.container_edits.env.push("NO_VALUE".into())),
        SpecError::Env { .. }
    ));
    assert!(matches!(
        invalid(
            |spec| spec.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into())
        ),
        SpecError::Permissions { .. }
    ));
    assert!(matches!(
        invalid(|spec| spec.devices[0].container_edits.device_nodes[0].path.clear()),
        SpecError::DeviceNodePath { .. }
    ));
    assert_eq!(
        invalid(|spec| spec.container_edits.mounts[0].container_path.clear()),
        SpecError::MountPath {
            scope: "spec-level edits".into(),
            which: "containerPath"
        }
    );
    assert!(matches!(
        invalid(|spec| spec.container_edits.hooks[0].path.clear()),
        SpecError::HookPath { .. }
    ));
    assert_eq!(
        invalid(|spec| spec.cdi_version = CdiVersion::V0_4_0),
        SpecError::VersionTooOld {
            declared: CdiVersion::V0_4_0,
            required: CdiVersion::V0_5_0,
            feature: "a device name starting with a digit"
        }
    );
}
