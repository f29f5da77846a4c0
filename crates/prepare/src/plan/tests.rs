use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tessera_api::config::{SharingStrategy, TimeSliceInterval};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};

use super::*;
use crate::checkpoint::{ClaimState, DeviceTarget, MigInstanceRecord, MigLifecycle};

const NODE: &str = "node-a";
const UID: &str = "0b3c0e7e-0000-4000-8000-000000000001";

fn inventory(name: &str) -> GpuInventory {
    MockSource::new(name).unwrap().inventory().unwrap()
}

fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": "gpu.tessera.dev", "pool": NODE, "device": device})
}

fn config(source: &str, requests: &[&str], parameters: Value) -> Value {
    json!({"source": source, "requests": requests,
           "opaque": {"driver": "gpu.tessera.dev", "parameters": parameters}})
}

fn gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing})
}

fn mig_config(sharing: Value) -> Value {
    json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "MigDeviceConfig", "sharing": sharing})
}

fn claim(results: Vec<Value>, configs: Vec<Value>) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"namespace": "ml", "name": "train", "uid": UID},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": results, "config": configs}}},
    }))
    .unwrap()
}

fn plan(
    claim: &ResourceClaim,
    inventory: &GpuInventory,
    mode: MigMode,
) -> Result<ClaimRecord, PlanError> {
    plan_claim(
        claim,
        &ClaimRef::new("ml", "train", UID),
        PlanContext {
            node_name: NODE,
            inventory,
            mig_mode: mode,
            mps_root: Path::new("/var/lib/tessera/mps"),
            total_shares: None,
            imex_root: Path::new("/var/lib/tessera/imex"),
        },
    )
}

#[test]
fn whole_gpus_resolve_with_their_uuid_and_cdi_ids() {
    let inv = inventory("dgx-h100");
    let c = claim(
        vec![
            result("gpus", "gpu-0"),
            result("gpus", "gpu-5"),
            json!({"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"}),
        ],
        vec![],
    );
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    assert_eq!(record.state, ClaimState::PrepareStarted);
    assert_eq!(
        (record.namespace.as_str(), record.name.as_str()),
        ("ml", "train")
    );
    assert_eq!(
        record.devices.len(),
        2,
        "the other driver's device is not ours"
    );
    let gpu5 = inv.gpu_by_minor(5).unwrap();
    assert_eq!(
        record.devices[1].target,
        DeviceTarget::Gpu {
            uuid: gpu5.uuid.clone(),
            minor: 5
        }
    );
    assert_eq!(
        record.devices[0].cdi_device_ids,
        vec![format!("gpu.tessera.dev/claim={UID}-gpu-0")]
    );
    assert_eq!(record.devices[0].sharing, None);
    assert_eq!(record.mps, None);
}

#[test]
fn static_mig_uses_the_existing_instance() {
    let inv = inventory("hgx-a100-mig");
    // minor 3 has 1g.10gb at placement 2 (gi 9, ci 0).
    let c = claim(vec![result("mig", "gpu-3-mig-1g-10gb-2")], vec![]);
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    let DeviceTarget::Mig {
        parent_minor,
        profile,
        placement_start,
        lifecycle,
        instance,
        ..
    } = &record.devices[0].target
    else {
        panic!("not a MIG target: {:?}", record.devices[0].target);
    };
    assert_eq!(
        (*parent_minor, profile.as_str(), *placement_start),
        (3, "1g.10gb", 2)
    );
    assert_eq!(*lifecycle, MigLifecycle::Static);
    assert_eq!(
        instance.as_ref(),
        Some(&MigInstanceRecord {
            uuid: "MIG-389f749c-615a-52bd-a919-5f5c1dc31183".into(),
            gpu_instance_id: 9,
            compute_instance_id: 0,
        })
    );

    // A placement without an instance cannot be prepared in static mode...
    let missing = claim(vec![result("mig", "gpu-3-mig-1g-10gb-6")], vec![]);
    assert!(matches!(
        plan(&missing, &inv, MigMode::Static),
        Err(PlanError::MigInstanceMissing { .. })
    ));
    // ...but is created in dynamic mode.
    let record = plan(&missing, &inv, MigMode::Dynamic).unwrap();
    assert!(matches!(
        record.devices[0].target,
        DeviceTarget::Mig {
            lifecycle: MigLifecycle::Dynamic,
            instance: None,
            ..
        }
    ));
}

#[test]
fn dynamic_mig_needs_mig_mode() {
    let inv = inventory("hgx-a100-mig");
    // minor 6 is MIG-capable with MIG mode off.
    let c = claim(vec![result("mig", "gpu-6-mig-1g-10gb-0")], vec![]);
    let err = plan(&c, &inv, MigMode::Dynamic).unwrap_err();
    assert!(matches!(err, PlanError::MigModeDisabled { .. }), "{err}");
    assert!(err.to_string().contains("-mig 1"), "{err}");
}

#[test]
fn admin_access_never_creates_or_reconfigures() {
    let inv = inventory("hgx-a100-mig");
    let mut admin = result("mig", "gpu-3-mig-1g-10gb-2");
    admin["adminAccess"] = json!(true);
    let c = claim(
        vec![admin],
        vec![config(
            "FromClaim",
            &[],
            mig_config(json!({"strategy": "MPS"})),
        )],
    );
    let record = plan(&c, &inv, MigMode::Dynamic).unwrap();
    assert!(matches!(
        record.devices[0].target,
        DeviceTarget::Mig {
            lifecycle: MigLifecycle::Static,
            instance: Some(_),
            ..
        }
    ));
    assert_eq!(record.devices[0].sharing, None);
    assert_eq!(record.mps, None);
}

#[test]
fn class_config_then_claim_config_last_wins() {
    let inv = inventory("dgx-h100");
    let c = claim(
        vec![
            result("a", "gpu-0"),
            result("b", "gpu-1"),
            result("c/x", "gpu-2"),
        ],
        vec![
            // The claim's config comes first in the list but applies after the class's.
            config(
                "FromClaim",
                &["a"],
                gpu_config(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})),
            ),
            config(
                "FromClass",
                &["a", "b", "c"],
                gpu_config(
                    json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}),
                ),
            ),
            json!({"source": "FromClaim", "requests": ["a"],
                   "opaque": {"driver": "other.example.com", "parameters": {"anything": true}}}),
        ],
    );
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    let intervals: Vec<TimeSliceInterval> = record
        .devices
        .iter()
        .map(|d| {
            d.sharing
                .as_ref()
                .unwrap()
                .time_slicing
                .as_ref()
                .unwrap()
                .interval
        })
        .collect();
    assert_eq!(
        intervals,
        vec![
            TimeSliceInterval::Long,
            TimeSliceInterval::Short,
            TimeSliceInterval::Short
        ]
    );
}

#[test]
fn configs_apply_by_kind_and_mps_gets_a_daemon_directory() {
    let inv = inventory("hgx-a100-mig");
    let c = claim(
        vec![
            result("whole", "gpu-6"),
            result("slice", "gpu-3-mig-1g-10gb-2"),
        ],
        vec![
            config(
                "FromClaim",
                &[],
                gpu_config(
                    json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 40}}),
                ),
            ),
            config(
                "FromClaim",
                &[],
                mig_config(json!({"strategy": "TimeSlicing"})),
            ),
        ],
    );
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    assert_eq!(
        record.devices[0].sharing.as_ref().unwrap().strategy,
        SharingStrategy::Mps
    );
    assert_eq!(
        record.devices[1].sharing.as_ref().unwrap().strategy,
        SharingStrategy::TimeSlicing
    );
    let mps = record.mps.unwrap();
    assert_eq!(
        mps.pipe_directory,
        format!("/var/lib/tessera/mps/{UID}/pipe")
    );
    assert_eq!(mps.log_directory, format!("/var/lib/tessera/mps/{UID}/log"));
}

fn nvidia_gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing})
}

fn opaque_of(driver: &str, requests: &[&str], parameters: Value) -> Value {
    json!({"source": "FromClaim", "requests": requests,
           "opaque": {"driver": driver, "parameters": parameters}})
}

#[test]
fn nvidia_mps_config_means_our_mps_with_per_device_limits_resolved() {
    let inv = inventory("dgx-h100");
    let gpu5 = inv.gpu_by_minor(5).unwrap().uuid.clone();
    let c = claim(
        vec![
            result("gpus", "gpu-2"),
            result("gpus", "gpu-5"),
            result("other", "gpu-7"),
        ],
        vec![
            opaque_of(
                "gpu.nvidia.com",
                &["gpus"],
                nvidia_gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                    "defaultActiveThreadPercentage": 30,
                    "defaultPinnedDeviceMemoryLimit": "4Gi",
                    // NVIDIA's keys: index among this config's devices, or a UUID.
                    "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", gpu5.clone(): "2Gi"}
                }})),
            ),
            opaque_of(
                "gpu.tessera.dev",
                &["other"],
                nvidia_gpu_config(
                    json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
                ),
            ),
        ],
    );
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    let mps = record.devices[0]
        .sharing
        .as_ref()
        .unwrap()
        .mps
        .clone()
        .unwrap();
    assert_eq!(mps.default_active_thread_percentage, Some(30));
    assert_eq!(mps.pinned_memory_limit_bytes("gpu-2"), Some(1 << 30));
    assert_eq!(mps.pinned_memory_limit_bytes("gpu-5"), Some(2 << 30));
    assert_eq!(
        record.devices[1].sharing.as_ref().unwrap().mps,
        Some(mps),
        "one config, one meaning for both devices"
    );
    assert!(record.mps.is_some(), "MPS gets its daemon directory");
    let ts = record.devices[2].sharing.as_ref().unwrap();
    assert_eq!(
        ts.time_slicing.as_ref().unwrap().interval,
        TimeSliceInterval::Short
    );

    let notes = translation_notes(&c);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with(
            "claim config spec.devices.config[0] (for request `gpus`): driver gpu.nvidia.com taken as gpu.tessera.dev"
        ),
        "{notes:?}"
    );
    assert!(
        notes[0].contains("sharing.mpsConfig → sharing.mps"),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with("claim config spec.devices.config[1] (for request `other`): "),
        "{notes:?}"
    );
    assert!(
        notes[1].contains("sharing.timeSlicingConfig → sharing.timeSlicing"),
        "{notes:?}"
    );
}

#[test]
fn nvidia_configs_for_nvidia_devices_are_left_to_nvidia() {
    let inv = inventory("dgx-h100");
    let c = claim(
        vec![
            result("gpus", "gpu-2"),
            json!({"request": "nv", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"}),
        ],
        vec![opaque_of(
            "gpu.nvidia.com",
            &[],
            nvidia_gpu_config(json!({"strategy": "MPS"})),
        )],
    );
    let record = plan(&c, &inv, MigMode::Static).unwrap();
    assert_eq!(record.devices.len(), 1);
    assert_eq!(record.devices[0].sharing, None);
    assert!(translation_notes(&c).is_empty());
}

/// A bad claim, what it tests, and a piece of the message refusing it must hold.
type Refusal = (&'static str, ResourceClaim, &'static str);

/// Claims whose allocation is not this node's to prepare: another UID, not allocated, another
/// driver or pool, a device this node does not have (on dgx-h100).
fn allocation_refusals() -> Vec<Refusal> {
    let mut wrong_uid = claim(vec![result("gpu", "gpu-0")], vec![]);
    wrong_uid.metadata.uid = Some("another-uid".into());
    let mut unallocated = claim(vec![], vec![]);
    unallocated.status = None;
    let foreign = claim(
        vec![
            json!({"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-b", "device": "gpu-0"}),
        ],
        vec![],
    );
    vec![
        ("uid", wrong_uid, "has UID another-uid, not"),
        ("unallocated", unallocated, "not allocated"),
        (
            "other driver only",
            claim(
                vec![
                    json!({"request": "n", "driver": "nic.example.com", "pool": NODE, "device": "eth0"}),
                ],
                vec![],
            ),
            "no device of driver gpu.tessera.dev",
        ),
        (
            "foreign pool",
            foreign,
            "of pool `node-b`, but this node's pool is `node-a`",
        ),
        (
            "unknown device",
            claim(vec![result("gpu", "gpu-42")], vec![]),
            "names device `gpu-42`, which this node does not have",
        ),
        (
            "not our name",
            claim(vec![result("gpu", "nvidia-0")], vec![]),
            "names device `nvidia-0`",
        ),
    ]
}

/// Configs whose fields do not read: unknown fields, values out of range, an unknown kind (on
/// dgx-h100).
fn config_field_refusals() -> Vec<Refusal> {
    vec![
        (
            "unknown field",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClaim",
                    &[],
                    json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharng": {}}),
                )],
            ),
            "claim config spec.devices.config[0] (for every request): field `sharng`: unknown field",
        ),
        (
            "a claim config is named by its index among the claim's configs, not the allocation's",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![
                    config(
                        "FromClass",
                        &[],
                        gpu_config(json!({"strategy": "TimeSlicing"})),
                    ),
                    config(
                        "FromClaim",
                        &["gpu"],
                        gpu_config(json!({"strategy": "TimeSlicing"})),
                    ),
                    config(
                        "FromClaim",
                        &["gpu", "other"],
                        json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharng": {}}),
                    ),
                ],
            ),
            "claim config spec.devices.config[1] (for requests `gpu`, `other`): field `sharng`",
        ),
        (
            "out of range",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClass",
                    &["gpu"],
                    gpu_config(
                        json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 0}}),
                    ),
                )],
            ),
            "DeviceClass config 0 of the allocation (for request `gpu`): field `sharing.mps.defaultActiveThreadPercentage`",
        ),
        (
            "unknown kind",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClaim",
                    &[],
                    json!({"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "NicConfig"}),
                )],
            ),
            "field `kind`: `NicConfig` is not a Tessera configuration kind",
        ),
    ]
}

/// Configs that name the wrong devices or requests (on dgx-h100).
fn config_target_refusals() -> Vec<Refusal> {
    vec![
        (
            "wrong kind for the named request",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClaim",
                    &["gpu"],
                    mig_config(json!({"strategy": "TimeSlicing"})),
                )],
            ),
            "has kind MigDeviceConfig, which configures mig devices, but it names request `gpu` whose device `gpu-0` is a gpu device; use kind GpuConfig",
        ),
        (
            "applies to nothing",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClaim",
                    &[],
                    mig_config(json!({"strategy": "TimeSlicing"})),
                )],
            ),
            "applies to no allocated mig device",
        ),
        (
            "names a request that does not exist",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromClaim",
                    &["gpus"],
                    gpu_config(json!({"strategy": "TimeSlicing"})),
                )],
            ),
            "claim config spec.devices.config[0] (for request `gpus`) of kind GpuConfig applies to no allocated gpu device",
        ),
    ]
}

/// NVIDIA-format configs Tessera cannot honour, and a config from an unknown source (on
/// dgx-h100).
fn nvidia_config_refusals() -> Vec<Refusal> {
    vec![
        (
            "NVIDIA multiUser",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![opaque_of(
                    "gpu.nvidia.com",
                    &[],
                    nvidia_gpu_config(json!({"strategy": "MPS", "mpsConfig": {"multiUser": true}})),
                )],
            ),
            "claim config spec.devices.config[0] (for every request): field `sharing.mpsConfig.multiUser`: `true` cannot be honoured",
        ),
        (
            "NVIDIA per-device index past the config's devices",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![opaque_of(
                    "gpu.tessera.dev",
                    &["gpu"],
                    nvidia_gpu_config(json!({"strategy": "MPS", "mpsConfig": {
                        "defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}}})),
                )],
            ),
            "field `sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.1`: device index 1 is out of range: this config applies to 1 device(s) (gpu-0)",
        ),
        (
            "bad source",
            claim(
                vec![result("gpu", "gpu-0")],
                vec![config(
                    "FromNowhere",
                    &[],
                    gpu_config(json!({"strategy": "TimeSlicing"})),
                )],
            ),
            "source `FromNowhere`",
        ),
    ]
}

/// Sharing settings a MIG node refuses (on hgx-a100-mig).
fn mig_refusals() -> Vec<Refusal> {
    vec![
        (
            "time slice on MIG",
            claim(
                vec![result("mig", "gpu-3-mig-1g-10gb-2")],
                vec![config(
                    "FromClaim",
                    &[],
                    mig_config(
                        json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
                    ),
                )],
            ),
            "time slice cannot be set",
        ),
        (
            "conflicting MPS settings",
            claim(
                vec![result("a", "gpu-6"), result("b", "gpu-7")],
                vec![
                    config(
                        "FromClaim",
                        &["a"],
                        gpu_config(
                            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 10}}),
                        ),
                    ),
                    config(
                        "FromClaim",
                        &["b"],
                        gpu_config(
                            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20}}),
                        ),
                    ),
                ],
            ),
            "devices `gpu-6` and `gpu-7` are shared with MPS by one daemon",
        ),
    ]
}

/// Each bad claim, and a piece of the message it must produce.
#[test]
fn bad_input_is_refused_with_a_message_naming_the_problem() {
    let dgx = inventory("dgx-h100");
    let mig = inventory("hgx-a100-mig");
    let on_dgx = [
        allocation_refusals(),
        config_field_refusals(),
        config_target_refusals(),
        nvidia_config_refusals(),
    ]
    .into_iter()
    .flatten()
    .map(|(what, claim, want)| (what, claim, &dgx, want));
    let on_mig = mig_refusals()
        .into_iter()
        .map(|(what, claim, want)| (what, claim, &mig, want));
    let cases: Vec<(&str, ResourceClaim, &GpuInventory, &str)> = on_dgx.chain(on_mig).collect();
    for (what, claim, inventory, want) in cases {
        let err = plan(&claim, inventory, MigMode::Static)
            .map(|r| format!("{r:?}"))
            .expect_err(what)
            .to_string();
        assert!(err.contains(want), "{what}: `{err}` lacks `{want}`");
    }
}

#[test]
fn an_allocation_for_another_node_by_name_is_refused() {
    let inv = inventory("dgx-h100");
    let by_name = |nodes: &[&str]| json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": nodes}]});
    let by_label =
        json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]});
    let with_selector = |terms: Vec<Value>| {
        let mut c = claim(vec![result("gpu", "gpu-0")], vec![]);
        let allocation = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
        allocation.node_selector =
            Some(serde_json::from_value(json!({"nodeSelectorTerms": terms})).unwrap());
        c
    };
    let err = plan(
        &with_selector(vec![by_name(&["node-b"])]),
        &inv,
        MigMode::Static,
    )
    .unwrap_err();
    assert!(
        matches!(&err, PlanError::ForeignNode { selected, .. } if selected == "node-b"),
        "{err}"
    );
    assert!(
        err.to_string().contains("not to this node (node-a)"),
        "{err}"
    );
    // Allowed: this node by name, another term naming it, or labels only (not judged here).
    for terms in [
        vec![by_name(&[NODE])],
        vec![by_name(&["node-b"]), by_name(&["node-c", NODE])],
        vec![by_label.clone()],
        vec![by_name(&["node-b"]), by_label],
    ] {
        let c = with_selector(terms.clone());
        assert!(plan(&c, &inv, MigMode::Static).is_ok(), "{terms:?}");
    }
}

fn shared_result(device: &str, share_id: &str, consumed: Value) -> Value {
    json!({"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": device,
           "shareID": share_id, "consumedCapacity": consumed})
}

fn plan_shared(claim: &ResourceClaim, total_shares: Option<u32>) -> ClaimRecord {
    let inv = inventory("dgx-h100");
    plan_claim(
        claim,
        &ClaimRef::new("ml", "train", UID),
        PlanContext {
            node_name: NODE,
            inventory: &inv,
            mig_mode: MigMode::Static,
            mps_root: Path::new("/var/lib/tessera/mps"),
            total_shares,
            imex_root: Path::new("/var/lib/tessera/imex"),
        },
    )
    .unwrap()
}

#[test]
fn a_shared_device_records_what_the_claim_consumed() {
    let mps = gpu_config(json!({"strategy": "MPS"}));
    let c = claim(
        vec![shared_result(
            "gpu-2",
            "5e0a1c2d-0000-4000-8000-000000000002",
            json!({"memory": "20Gi", "shares": "1", "multiprocessors": "0"}),
        )],
        vec![config("FromClaim", &[], mps)],
    );
    let record = plan_shared(&c, Some(4));
    let share = record.devices[0].share.clone().unwrap();
    assert_eq!(share.share_id, "5e0a1c2d-0000-4000-8000-000000000002");
    assert_eq!(share.memory_bytes, Some(20 << 30));
    assert_eq!((share.shares, share.total_shares), (Some(1), Some(4)));

    // MPS enforces the share: the pinned limit is the memory consumed, threads follow shares.
    let daemon = crate::sharing::mps_daemon(UID, &record).unwrap();
    assert_eq!(daemon.devices[0].pinned_memory_limit_bytes, Some(20 << 30));
    assert_eq!(daemon.active_thread_percentage, Some(25));

    // The container is told its part, per request like the visible devices.
    let spec = crate::cdi_spec::claim_spec(
        UID,
        &record,
        &crate::mig::MigCapMinors::parse(""),
        &crate::injection::DriverInjection::none(),
    )
    .unwrap();
    let env = &spec.devices[0].container_edits.env;
    for wanted in [
        format!("TESSERA_GPU_MEMORY_LIMIT={}", 20u64 << 30),
        "TESSERA_GPU_SHARES=1".to_owned(),
        "TESSERA_GPU_SHARES_TOTAL=4".to_owned(),
    ] {
        assert!(env.contains(&wanted), "{wanted} not in {env:?}");
    }
}

#[test]
fn a_lower_configured_mps_limit_wins_and_no_request_means_no_limit() {
    let mps = gpu_config(json!({"strategy": "MPS", "mps": {
        "defaultActiveThreadPercentage": 10, "defaultPinnedDeviceMemoryLimit": "8Gi"}}));
    let c = claim(
        vec![shared_result(
            "gpu-0",
            "s-1",
            json!({"memory": "20Gi", "shares": "2"}),
        )],
        vec![config("FromClaim", &[], mps.clone())],
    );
    let daemon = crate::sharing::mps_daemon(UID, &plan_shared(&c, Some(4))).unwrap();
    assert_eq!(daemon.devices[0].pinned_memory_limit_bytes, Some(8 << 30));
    assert_eq!(daemon.active_thread_percentage, Some(10));

    // A configured limit above the share is cut to the share.
    let generous = gpu_config(json!({"strategy": "MPS", "mps": {
        "defaultActiveThreadPercentage": 90, "defaultPinnedDeviceMemoryLimit": "40Gi"}}));
    let c = claim(
        vec![shared_result(
            "gpu-0",
            "s-1",
            json!({"memory": "20Gi", "shares": "2"}),
        )],
        vec![config("FromClaim", &[], generous)],
    );
    let daemon = crate::sharing::mps_daemon(UID, &plan_shared(&c, Some(4))).unwrap();
    assert_eq!(daemon.devices[0].pinned_memory_limit_bytes, Some(20 << 30));
    assert_eq!(daemon.active_thread_percentage, Some(50));

    // `unlimited` mode, nothing asked: no memory consumed, so no limit is invented.
    let c = claim(
        vec![shared_result("gpu-0", "s-1", json!({"memory": "0"}))],
        vec![config(
            "FromClaim",
            &[],
            gpu_config(json!({"strategy": "MPS"})),
        )],
    );
    let record = plan_shared(&c, None);
    let daemon = crate::sharing::mps_daemon(UID, &record).unwrap();
    assert_eq!(daemon.devices[0].pinned_memory_limit_bytes, None);
    assert_eq!(daemon.active_thread_percentage, None);

    // A device allocated whole has no share and no share environment.
    let c = claim(vec![result("gpu", "gpu-0")], vec![]);
    let record = plan_shared(&c, Some(4));
    assert_eq!(record.devices[0].share, None);
}

#[test]
fn an_mps_limit_beyond_the_devices_memory_is_refused_naming_the_field() {
    let dgx = inventory("dgx-h100");
    let memory_mib = dgx.gpus[0].memory_bytes >> 20;
    let within = format!("{memory_mib}Mi");
    let beyond = format!("{}Mi", memory_mib + 1);
    let planned = |limits: Value| {
        let mps = gpu_config(json!({"strategy": "MPS", "mps": limits}));
        plan(
            &claim(
                vec![result("gpu", "gpu-0")],
                vec![config("FromClaim", &[], mps)],
            ),
            &dgx,
            MigMode::Static,
        )
    };

    let record = planned(json!({"defaultPinnedDeviceMemoryLimit": within})).unwrap();
    let daemon = crate::sharing::mps_daemon(UID, &record).unwrap();
    assert_eq!(
        daemon.devices[0].pinned_memory_limit_bytes,
        Some(memory_mib << 20)
    );

    let error = planned(json!({"defaultPinnedDeviceMemoryLimit": beyond})).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "`sharing.mps.defaultPinnedDeviceMemoryLimit` is {}Mi, more than device `gpu-0` has \
             ({memory_mib}Mi); use at most {memory_mib}Mi, or remove the field for no limit",
            memory_mib + 1
        )
    );
    let error = planned(json!({"defaultPinnedDeviceMemoryLimit": "1Gi",
        "perDevicePinnedMemoryLimit": {"gpu-0": "1Ti"}}))
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("`sharing.mps.perDevicePinnedMemoryLimit.gpu-0` is 1048576Mi"),
        "{error}"
    );

    // A MIG device has its profile's memory, not its GPU's.
    let mig = inventory("hgx-a100-mig");
    let device = "gpu-3-mig-1g-10gb-2";
    let Some(ResolvedDevice::Mig { profile, .. }) = mig.resolve_device(device) else {
        panic!("{device} is not a MIG device of hgx-a100-mig");
    };
    let c = claim(
        vec![result("slice", device)],
        vec![config(
            "FromClaim",
            &[],
            mig_config(json!({"strategy": "MPS", "mps": {
                "defaultPinnedDeviceMemoryLimit": format!("{}Mi", (profile.memory_bytes >> 20) + 1)}})),
        )],
    );
    let error = plan(&c, &mig, MigMode::Static).unwrap_err();
    assert!(
        matches!(&error, PlanError::PinnedMemoryBeyondDevice { memory_mib, .. }
            if *memory_mib == profile.memory_bytes >> 20),
        "{error}"
    );
}
