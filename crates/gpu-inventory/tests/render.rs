//! Rendering inventories into ResourceSlices: the published devices, static and dynamic MIG,
//! slice splitting, and snapshots of every shipped topology.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceTaint, ResourceSlice};
use pretty_assertions::assert_eq;
use tessera_api::names::{TOPOLOGY_MANAGED_TAINT, counter};
use tessera_api::schema::{self, AttributeKind, Carriers};
use tessera_gpu_inventory::{
    DeviceSource, GpuInventory, MockSource, RenderError, RenderOptions, SHIPPED_TOPOLOGIES,
    ServerVersion, check_pool, check_slice, render_slices,
};

fn shipped(name: &str) -> GpuInventory {
    MockSource::new(name).unwrap().inventory().unwrap()
}

fn options(server: ServerVersion, dynamic_mig: bool) -> RenderOptions {
    RenderOptions {
        server_version: server,
        dynamic_mig,
        ..RenderOptions::new("node-1")
    }
}

fn devices(slices: &[ResourceSlice]) -> Vec<&Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}

fn attr<'a>(device: &'a Device, name: &str) -> &'a k8s_openapi::api::resource::v1::DeviceAttribute {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get(name))
        .unwrap_or_else(|| panic!("{} has no attribute {name}", device.name))
}

fn string_attr<'a>(device: &'a Device, name: &str) -> &'a str {
    attr(device, name).string.as_deref().unwrap()
}

fn capacity(device: &Device, name: &str) -> String {
    device.capacity.as_ref().unwrap()[name].value.0.clone()
}

#[test]
fn dgx_h100_publishes_eight_whole_gpus_in_one_island() {
    let slices = render_slices(&shipped("dgx-h100"), &RenderOptions::new("dgx-1")).unwrap();
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(
        slice.metadata.name.as_deref(),
        Some("dgx-1-gpu.tessera.dev-0")
    );
    assert_eq!(slice.spec.node_name.as_deref(), Some("dgx-1"));
    assert_eq!(slice.spec.pool.name, "dgx-1");
    assert_eq!(slice.spec.pool.resource_slice_count, 1);
    let devices = devices(&slices);
    assert_eq!(devices.len(), 8);
    let islands: BTreeSet<&str> = devices
        .iter()
        .map(|d| string_attr(d, "nvlinkIsland"))
        .collect();
    assert_eq!(islands.len(), 1);
    let numa: BTreeSet<i64> = devices
        .iter()
        .map(|d| attr(d, "numaNode").int.unwrap())
        .collect();
    assert_eq!(numa, BTreeSet::from([0, 1]));
    let gpu0 = devices[0];
    assert_eq!(gpu0.name, "gpu-0");
    assert_eq!(string_attr(gpu0, "type"), "gpu");
    assert_eq!(string_attr(gpu0, "productName"), "NVIDIA H100 80GB HBM3");
    assert_eq!(string_attr(gpu0, "architecture"), "Hopper");
    assert_eq!(
        attr(gpu0, "cudaComputeCapability").version.as_deref(),
        Some("9.0.0")
    );
    assert_eq!(
        attr(gpu0, "driverVersion").version.as_deref(),
        Some("550.54.15")
    );
    assert_eq!(
        attr(gpu0, "cudaDriverVersion").version.as_deref(),
        Some("12.4.0")
    );
    assert_eq!(attr(gpu0, "nvlinkLinks").int, Some(18));
    assert_eq!(attr(gpu0, "nvlinkBandwidthGBps").int, Some(900));
    assert_eq!(attr(gpu0, "migCapable").bool, Some(true));
    assert_eq!(attr(gpu0, "migEnabled").bool, Some(false));
    assert_eq!(
        string_attr(gpu0, "resource.kubernetes.io/pciBusID"),
        "0000:18:00.0"
    );
    assert_eq!(
        string_attr(gpu0, "resource.kubernetes.io/pcieRoot"),
        "pci0000:15"
    );
    assert_eq!(capacity(gpu0, "memory"), (81559u64 << 20).to_string());
    assert_eq!(capacity(gpu0, "multiprocessors"), "132");
    assert!(gpu0.taints.is_none() && gpu0.consumes_counters.is_none());
}

#[test]
fn leading_zeros_are_stripped_from_versions() {
    let slices = render_slices(&shipped("pcie-l40s"), &RenderOptions::new("n")).unwrap();
    for device in devices(&slices) {
        assert_eq!(
            attr(device, "driverVersion").version.as_deref(),
            Some("535.129.3")
        );
        assert_eq!(
            attr(device, "cudaComputeCapability").version.as_deref(),
            Some("8.9.0")
        );
        assert!(
            device
                .attributes
                .as_ref()
                .unwrap()
                .get("nvlinkIsland")
                .is_none()
        );
    }
}

#[test]
fn static_mig_publishes_instances_instead_of_their_gpu() {
    let inv = shipped("hgx-a100-mig");
    let slices = render_slices(&inv, &RenderOptions::new("hgx")).unwrap();
    let devices = devices(&slices);
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    for gpu in &inv.gpus {
        let whole = format!("gpu-{}", gpu.minor);
        assert_eq!(
            names.contains(&whole.as_str()),
            !gpu.mig_enabled(),
            "{whole}"
        );
    }
    // 7 + 4 + 2 + 4 MIG devices and 4 whole GPUs.
    assert_eq!(devices.len(), 21);
    let mig = devices
        .iter()
        .find(|d| d.name == "gpu-1-mig-1g-10gb-me-2")
        .expect("GPU index 3 is minor 1; its 1g.10gb+me sits at slice 2");
    assert_eq!(string_attr(mig, "type"), "mig");
    assert_eq!(string_attr(mig, "profile"), "1g.10gb+me");
    assert_eq!(string_attr(mig, "parentUUID"), inv.gpus[3].uuid);
    assert_eq!(
        string_attr(mig, "uuid"),
        inv.gpus[3].mig.as_ref().unwrap().instances[1].uuid
    );
    assert_eq!(attr(mig, "index").int, Some(3));
    assert_eq!(attr(mig, "minor").int, Some(1));
    assert_eq!(capacity(mig, "memory"), (9728u64 << 20).to_string());
    for (name, value) in [
        ("multiprocessors", "14"),
        ("copyEngines", "1"),
        ("decoders", "1"),
        ("encoders", "0"),
        ("jpegEngines", "1"),
        ("ofaEngines", "1"),
    ] {
        assert_eq!(capacity(mig, name), value, "{name}");
    }
    assert!(mig.attributes.as_ref().unwrap().get("migEnabled").is_none());
}

#[test]
fn every_published_attribute_and_capacity_is_in_the_schema() {
    for (name, _) in SHIPPED_TOPOLOGIES {
        for dynamic in [false, true] {
            let slices =
                render_slices(&shipped(name), &options(ServerVersion::V1_35, dynamic)).unwrap();
            for device in devices(&slices) {
                check_against_schema(device);
            }
        }
    }
}

fn check_against_schema(device: &Device) {
    let attributes = device.attributes.as_ref().unwrap();
    let device_type = attributes["type"].string.as_deref().unwrap();
    let carried = |carriers: Carriers| match carriers {
        Carriers::All => true,
        Carriers::Gpu => device_type == "gpu",
        Carriers::Mig => device_type == "mig",
    };
    for (name, value) in attributes {
        let (domain, id) = schema::split_qualified(name);
        let spec = schema::attribute(domain, id)
            .unwrap_or_else(|| panic!("{}: attribute {name} is not in the schema", device.name));
        assert!(
            carried(spec.carriers),
            "{}: {name} on a {device_type}",
            device.name
        );
        let kind_matches = match spec.kind {
            AttributeKind::Int => value.int.is_some(),
            AttributeKind::Bool => value.bool.is_some(),
            AttributeKind::String => value.string.is_some(),
            AttributeKind::Version => value.version.is_some(),
        };
        assert!(kind_matches, "{}: {name} has the wrong type", device.name);
    }
    for spec in schema::ATTRIBUTES {
        if carried(spec.carriers) && !spec.optional {
            assert!(
                attributes.contains_key(spec.name),
                "{}: missing {}",
                device.name,
                spec.name
            );
        }
    }
    for name in device.capacity.as_ref().unwrap().keys() {
        let (domain, id) = schema::split_qualified(name);
        let spec = schema::capacity(domain, id)
            .unwrap_or_else(|| panic!("{}: capacity {name} is not in the schema", device.name));
        assert!(
            carried(spec.carriers),
            "{}: {name} on a {device_type}",
            device.name
        );
    }
}

#[test]
fn dynamic_mig_split_form_puts_counter_sets_in_slices_of_their_own() {
    let inv = shipped("hgx-a100-mig");
    let slices = render_slices(&inv, &options(ServerVersion::V1_35, true)).unwrap();
    let counter_slices: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_some())
        .collect();
    assert_eq!(counter_slices.len(), 1);
    assert!(counter_slices[0].spec.devices.is_none());
    let sets: Vec<&str> = counter_slices[0]
        .spec
        .shared_counters
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    // The MIG-enabled GPUs are indices 0-3, minors 2, 3, 0, 1.
    assert_eq!(
        sets,
        [
            "gpu-2-counters",
            "gpu-3-counters",
            "gpu-0-counters",
            "gpu-1-counters"
        ]
    );
    // 4 partitionable GPUs × (1 whole + 25 placements) + 4 plain GPUs, at most 64 per slice.
    let devices = devices(&slices);
    assert_eq!(devices.len(), 4 * 26 + 4);
    assert_eq!(slices.len(), 1 + 2);
    for slice in &slices {
        assert_eq!(slice.spec.pool.resource_slice_count, 3);
        check_slice(slice, ServerVersion::V1_35).unwrap();
    }
    // Placements carry no uuid, not even where an instance exists (gpu-2's 1g.10gb@3), so the
    // published devices do not change when prepare creates or destroys instances.
    for name in ["gpu-2-mig-1g-10gb-3", "gpu-2-mig-7g-80gb-0"] {
        let device = devices.iter().find(|d| d.name == name).unwrap();
        assert!(device.attributes.as_ref().unwrap().get("uuid").is_none());
    }
    let mut without_instances = inv.clone();
    for gpu in &mut without_instances.gpus {
        if let Some(mig) = &mut gpu.mig {
            mig.instances.clear();
        }
    }
    assert_eq!(
        render_slices(&without_instances, &options(ServerVersion::V1_35, true)).unwrap(),
        slices
    );
}

#[test]
fn dynamic_mig_combined_form_keeps_sets_with_their_devices() {
    let inv = shipped("hgx-a100-mig");
    let slices = render_slices(&inv, &options(ServerVersion::V1_34, true)).unwrap();
    // 1.34 allows 32 shared counters per slice; an A100 set has 14, so two GPUs per slice.
    let per_slice: Vec<usize> = slices
        .iter()
        .map(|s| s.spec.shared_counters.as_ref().map_or(0, Vec::len))
        .collect();
    // The four plain GPUs fit after the second pair.
    assert_eq!(per_slice, [2, 2]);
    assert_eq!(devices(&slices).len(), 4 * 26 + 4);
    for slice in &slices {
        check_slice(slice, ServerVersion::V1_34).unwrap();
        let defined: BTreeSet<&str> = slice
            .spec
            .shared_counters
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        for device in slice.spec.devices.iter().flatten() {
            for consumption in device.consumes_counters.iter().flatten() {
                assert!(
                    defined.contains(consumption.counter_set.as_str()),
                    "{}",
                    device.name
                );
            }
        }
    }
    // The same pool cannot be published to a 1.35 server: it mixes sets and devices.
    let violations = check_slice(&slices[0], ServerVersion::V1_35).unwrap_err();
    assert!(violations[0].message.contains("not both"), "{violations:?}");
}

#[test]
fn placements_consume_exactly_their_share_of_the_counter_set() {
    let inv = shipped("hgx-a100-mig");
    let slices = render_slices(&inv, &options(ServerVersion::V1_35, true)).unwrap();
    let set = slices[0].spec.shared_counters.as_ref().unwrap()[0].clone();
    let value = |c: &str| set.counters[c].value.0.parse::<u64>().unwrap();
    assert_eq!(
        set.counters.len(),
        8 + 3 + 3,
        "slices, compute/memory/SMs, dec/jpeg/ofa"
    );
    assert_eq!(value("compute-slices"), 7);
    assert_eq!(value("ofa-engines"), 1);
    assert_eq!(value("decoders"), 5);
    let devices = devices(&slices);
    let consumed = |name: &str| -> BTreeMap<String, u64> {
        let device = devices.iter().find(|d| d.name == name).unwrap();
        let consumption = &device.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(consumption.counter_set, set.name);
        consumption
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), v.value.0.parse().unwrap()))
            .collect()
    };
    // The whole GPU takes everything.
    assert_eq!(consumed("gpu-2").len(), set.counters.len());
    // 3g.40gb at 4 covers memory slices 4..7: three compute slices, two decoders.
    let three_g = consumed("gpu-2-mig-3g-40gb-4");
    let slices_used: Vec<&String> = three_g
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .collect();
    assert_eq!(
        slices_used,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    assert_eq!(three_g["compute-slices"], 3);
    assert_eq!(three_g["decoders"], 2);
    assert_eq!(three_g[counter::MEMORY], 40192 << 20);
    // Two 1g.10gb+me never fit together: one OFA engine per GPU.
    assert_eq!(consumed("gpu-2-mig-1g-10gb-me-0")["ofa-engines"], 1);
    assert_eq!(consumed("gpu-2-mig-1g-10gb-me-5")["ofa-engines"], 1);
    // A full valid layout (4g.40gb@0 + 3g.40gb@4) fits in every counter.
    let four_g = consumed("gpu-2-mig-4g-40gb-0");
    for name in set.counters.keys() {
        let used = four_g.get(name).unwrap_or(&0) + three_g.get(name).unwrap_or(&0);
        assert!(used <= value(name), "{name}: {used} > {}", value(name));
    }
}

#[test]
fn topology_managed_nodes_taint_every_device() {
    let mut options = RenderOptions {
        topology_managed: true,
        ..RenderOptions::new("n")
    };
    let xid = DeviceTaint {
        key: "gpu.tessera.dev/xid".into(),
        value: Some("79".into()),
        effect: "NoExecute".into(),
        ..DeviceTaint::default()
    };
    options
        .device_taints
        .insert("gpu-3".into(), vec![xid.clone()]);
    let slices = render_slices(&shipped("dgx-h100"), &options).unwrap();
    for device in devices(&slices) {
        let taints = device.taints.as_ref().unwrap();
        assert_eq!(taints[0].key, TOPOLOGY_MANAGED_TAINT);
        assert_eq!(taints[0].effect, "NoSchedule");
        let want = if device.name == "gpu-3" { 2 } else { 1 };
        assert_eq!(taints.len(), want, "{}", device.name);
    }
    // Five taints on one device are too many for 1.34 (4) but fine for 1.35 (16).
    options.device_taints.insert("gpu-3".into(), vec![xid; 4]);
    let err = render_slices(&shipped("dgx-h100"), &options).unwrap_err();
    assert!(matches!(err, RenderError::InvalidSlice { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("spec.devices[3].taints: 5 taints, at most 4"),
        "{err}"
    );
    options.server_version = ServerVersion::V1_35;
    render_slices(&shipped("dgx-h100"), &options).unwrap();
}

/// A node with `n` whole GPUs and no NVLink.
fn synthetic(n: u32) -> GpuInventory {
    let mut inv = shipped("pcie-l40s");
    let template = inv.gpus[0].clone();
    inv.gpus = (0..n)
        .map(|i| {
            let mut gpu = template.clone();
            gpu.uuid = format!("GPU-00000000-0000-0000-0000-{i:012x}");
            gpu.index = i;
            gpu.minor = i;
            gpu.pci_bus_id = format!("{:04x}:{:02x}:00.0", i / 256, i % 256);
            gpu
        })
        .collect();
    inv
}

#[test]
fn three_hundred_devices_render_into_three_valid_slices() {
    for server in [ServerVersion::V1_34, ServerVersion::V1_35] {
        let slices = render_slices(&synthetic(300), &options(server, false)).unwrap();
        let sizes: Vec<usize> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 128, 44]);
        let names: Vec<&str> = slices
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "node-1-gpu.tessera.dev-0",
                "node-1-gpu.tessera.dev-1",
                "node-1-gpu.tessera.dev-2"
            ]
        );
        for slice in &slices {
            assert_eq!(slice.spec.pool.resource_slice_count, 3);
            check_slice(slice, server).unwrap();
        }
        check_pool(&slices).unwrap();
    }
    // Tainted devices: at most 64 per slice.
    let managed = RenderOptions {
        topology_managed: true,
        ..RenderOptions::new("node-1")
    };
    let slices = render_slices(&synthetic(300), &managed).unwrap();
    let sizes: Vec<usize> = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().unwrap().len())
        .collect();
    assert_eq!(sizes, [64, 64, 64, 64, 44]);
}

#[test]
fn a_node_without_gpus_renders_no_slices() {
    let mut inv = shipped("pcie-l40s");
    inv.gpus.clear();
    assert_eq!(
        render_slices(&inv, &RenderOptions::new("n")).unwrap(),
        vec![]
    );
}

#[test]
fn oversized_gpus_are_refused_not_published() {
    // A made-up MIG GPU with 70 one-slice placements: 71 devices.
    let mut inv = shipped("hgx-a100-mig");
    let mig = inv.gpus[2].mig.as_mut().unwrap();
    mig.instances.clear();
    mig.profiles.retain(|p| p.name == "1g.10gb");
    mig.profiles[0].placements = (0..70).collect();
    let err = render_slices(&inv, &options(ServerVersion::V1_34, true)).unwrap_err();
    assert_eq!(
        err,
        RenderError::GpuDoesNotFitInSlice {
            gpu: "gpu-0".into(),
            reason: "71 devices, at most 64".into()
        }
    );
    // 1.35 can split the devices, but 70 memory-slice counters exceed a counter set's 32.
    let err = render_slices(&inv, &options(ServerVersion::V1_35, true)).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.sharedCounters[2].counters: 73 counters, at most 32"),
        "{err}"
    );
}

#[test]
fn bad_options_are_errors() {
    let inv = shipped("pcie-l40s");
    for (options, option) in [
        (RenderOptions::new("Node_1"), "node_name"),
        (
            RenderOptions {
                driver_name: "gpu".repeat(30),
                ..RenderOptions::new("n")
            },
            "driver_name",
        ),
        (
            RenderOptions {
                pool_generation: -1,
                ..RenderOptions::new("n")
            },
            "pool_generation",
        ),
    ] {
        match render_slices(&inv, &options) {
            Err(RenderError::InvalidOption { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: {other:?}"),
        }
    }
}

#[test]
fn rendering_is_deterministic_across_enumeration_order() {
    let inv = shipped("hgx-a100-mig");
    let mut shuffled = inv.clone();
    shuffled.gpus.reverse();
    shuffled.normalize();
    let opts = options(ServerVersion::V1_35, true);
    assert_eq!(render_slices(&inv, &opts), render_slices(&shuffled, &opts));
}

#[test]
fn snapshots_of_every_shipped_topology() {
    for (name, _) in SHIPPED_TOPOLOGIES {
        let slices = render_slices(&shipped(name), &RenderOptions::new("node-1")).unwrap();
        insta::assert_yaml_snapshot!(format!("{name}"), slices);
    }
    let slices = render_slices(
        &shipped("hgx-a100-mig"),
        &options(ServerVersion::V1_35, true),
    )
    .unwrap();
    insta::assert_yaml_snapshot!("hgx-a100-mig-dynamic-1.35", slices);
}

/// The 1.34 combined form, summarized: which counter sets and devices each slice holds.
#[test]
fn snapshot_of_the_combined_form_layout() {
    let slices = render_slices(
        &shipped("hgx-a100-mig"),
        &options(ServerVersion::V1_34, true),
    )
    .unwrap();
    let layout: Vec<(String, Vec<String>, Vec<String>)> = slices
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap(),
                s.spec
                    .shared_counters
                    .iter()
                    .flatten()
                    .map(|c| c.name.clone())
                    .collect(),
                s.spec
                    .devices
                    .iter()
                    .flatten()
                    .map(|d| d.name.clone())
                    .collect(),
            )
        })
        .collect();
    insta::assert_yaml_snapshot!(layout);
}

fn shared(topology: &str, mode: &str) -> Vec<ResourceSlice> {
    let options = RenderOptions {
        consumable_shares: mode.parse().unwrap(),
        ..options(ServerVersion::new(1, 37), false)
    };
    render_slices(&shipped(topology), &options).unwrap()
}

/// (default, min, max, step) of a capacity's range policy.
fn range(device: &Device, name: &str) -> (String, String, String, String) {
    let policy = device.capacity.as_ref().unwrap()[name]
        .request_policy
        .as_ref()
        .unwrap_or_else(|| panic!("{}: {name} has no request policy", device.name));
    assert!(policy.valid_values.is_none());
    let range = policy.valid_range.as_ref().unwrap();
    (
        policy.default.as_ref().unwrap().0.clone(),
        range.min.0.clone(),
        range.max.as_ref().unwrap().0.clone(),
        range.step.as_ref().unwrap().0.clone(),
    )
}

const H100_MEMORY: &str = "85520809984"; // 81559Mi, already a whole number of MiB
const MI: &str = "1048576";

#[test]
fn consumable_shares_disabled_publishes_exclusive_devices() {
    for device in devices(&shared("dgx-h100", "disabled")) {
        assert_eq!(device.allow_multiple_allocations, None, "{}", device.name);
        assert!(
            device
                .capacity
                .as_ref()
                .unwrap()
                .values()
                .all(|c| c.request_policy.is_none())
        );
        assert!(!device.capacity.as_ref().unwrap().contains_key("shares"));
    }
}

#[test]
fn consumable_shares_unlimited_lets_claims_ask_for_no_memory() {
    let slices = shared("dgx-h100", "unlimited");
    let all = devices(&slices);
    assert_eq!(all.len(), 8);
    for device in all {
        assert_eq!(device.allow_multiple_allocations, Some(true));
        assert_eq!(capacity(device, "memory"), H100_MEMORY);
        assert_eq!(
            range(device, "memory"),
            ("0".into(), "0".into(), H100_MEMORY.into(), MI.into())
        );
        // Multiprocessors: default 0, or the first claim would consume all of them.
        assert_eq!(range(device, "multiprocessors").0, "0");
        assert!(!device.capacity.as_ref().unwrap().contains_key("shares"));
    }
}

#[test]
fn consumable_shares_memory_gives_an_unset_request_the_whole_gpu() {
    for device in devices(&shared("dgx-h100", "memory")) {
        assert_eq!(device.allow_multiple_allocations, Some(true));
        assert_eq!(
            range(device, "memory"),
            (H100_MEMORY.into(), MI.into(), H100_MEMORY.into(), MI.into())
        );
        assert!(!device.capacity.as_ref().unwrap().contains_key("shares"));
    }
}

#[test]
fn consumable_shares_n_publishes_a_shares_capacity() {
    for device in devices(&shared("dgx-h100", "4")) {
        assert_eq!(device.allow_multiple_allocations, Some(true));
        assert_eq!(capacity(device, "shares"), "4");
        assert_eq!(
            range(device, "shares"),
            ("1".into(), "1".into(), "4".into(), "1".into())
        );
        assert_eq!(range(device, "memory").0, "0");
        check_against_schema(device);
    }
}

#[test]
fn consumable_shares_cover_static_mig_devices_but_never_counter_consumers() {
    // Static MIG: the instances are shared, every capacity but the empty ones with a policy
    // (the API server refuses a step larger than a capacity of 0), and the slices pass its rules.
    let slices = shared("hgx-a100-mig", "memory");
    for slice in &slices {
        check_slice(slice, ServerVersion::new(1, 37)).unwrap();
    }
    let migs: Vec<&Device> = devices(&slices)
        .into_iter()
        .filter(|d| string_attr(d, "type") == "mig")
        .collect();
    assert!(!migs.is_empty());
    for device in migs {
        assert_eq!(
            device.allow_multiple_allocations,
            Some(true),
            "{}",
            device.name
        );
        for (name, c) in device.capacity.as_ref().unwrap() {
            assert_eq!(
                c.request_policy.is_some(),
                c.value.0 != "0",
                "{}: {name}",
                device.name
            );
        }
    }
    // Dynamic MIG: devices that consume counters are published as before.
    let options = RenderOptions {
        consumable_shares: "4".parse().unwrap(),
        ..options(ServerVersion::new(1, 37), true)
    };
    let slices = render_slices(&shipped("hgx-a100-mig"), &options).unwrap();
    for device in devices(&slices) {
        if device.consumes_counters.is_some() {
            assert_eq!(device.allow_multiple_allocations, None, "{}", device.name);
        }
    }
}

#[test]
fn the_slice_check_enforces_the_apis_request_policy_rules() {
    use k8s_openapi::api::resource::v1::CapacityRequestPolicy;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let slices = shared("pcie-l40s", "4");
    let server = ServerVersion::new(1, 37);
    check_slice(&slices[0], server).unwrap();
    let edit = |change: &dyn Fn(&mut Device)| {
        let mut slice = slices[0].clone();
        change(&mut slice.spec.devices.as_mut().unwrap()[0]);
        check_slice(&slice, server).unwrap_err()
    };
    let text = |v: Vec<tessera_gpu_inventory::Violation>| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    fn policy(d: &mut Device) -> &mut CapacityRequestPolicy {
        d.capacity
            .as_mut()
            .unwrap()
            .get_mut("shares")
            .unwrap()
            .request_policy
            .as_mut()
            .unwrap()
    }
    let e = text(edit(&|d| d.allow_multiple_allocations = None));
    assert!(e.contains("needs allowMultipleAllocations: true"), "{e}");
    let e = text(edit(&|d| policy(d).default = Some(Quantity("5".into()))));
    assert!(e.contains("min <= default <= max <= capacity"), "{e}");
    let e = text(edit(&|d| policy(d).default = None));
    assert!(e.contains("validRange needs a default"), "{e}");
    let e = text(edit(&|d| {
        policy(d).valid_range.as_mut().unwrap().step = Some(Quantity("2".into()))
    }));
    assert!(e.contains("whole steps of 2"), "{e}");
    let e = text(edit(&|d| {
        let shares = d.capacity.as_mut().unwrap().get_mut("shares").unwrap();
        shares.value = Quantity("0".into());
        let range = shares.request_policy.as_mut().unwrap();
        range.default = Some(Quantity("0".into()));
        let range = range.valid_range.as_mut().unwrap();
        range.min = Quantity("0".into());
        range.max = Some(Quantity("0".into()));
    }));
    assert!(
        e.contains("one step 1 is larger than the capacity 0"),
        "{e}"
    );
    let e = text(edit(&|d| {
        policy(d).valid_values = Some(vec![Quantity("1".into())])
    }));
    assert!(e.contains("mutually exclusive"), "{e}");
}
