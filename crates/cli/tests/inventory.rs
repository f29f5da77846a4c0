//! `tessera inventory` run as a binary: what the node would publish for the shipped topologies,
//! and clean failures for bad input.

use std::collections::BTreeSet;
use std::process::{Command, Output};

use serde_json::Value;
use tessera_gpu_inventory::{DeviceSource, MockSource};

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        // Users' shells often set it; an input error must still read as one line, not a trace.
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the tessera binary runs")
}

/// `tessera inventory --topology NAME -o json [extra]`, parsed.
fn inventory_json(topology: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["inventory", "--topology", topology, "-o", "json"];
    args.extend_from_slice(extra);
    let out = tessera(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slices: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    slices.as_array().expect("a JSON array").clone()
}

fn devices(slices: &[Value]) -> Vec<&Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect()
}

fn attribute<'a>(device: &'a Value, name: &str) -> &'a Value {
    &device["attributes"][name]
}

#[test]
fn dgx_h100_json_shows_eight_gpus_in_one_island_on_two_numa_nodes() {
    let slices = inventory_json("dgx-h100", &[]);
    for slice in &slices {
        assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(slice["kind"], "ResourceSlice");
        assert_eq!(slice["spec"]["driver"], "gpu.tessera.dev");
    }
    let devices = devices(&slices);
    assert_eq!(devices.len(), 8);
    // Every attribute the topology implies: NVLink and NUMA, no MIG devices, no fabric.
    let implied = [
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "index",
        "minor",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "migCapable",
        "migEnabled",
        "nvlinkIsland",
        "nvlinkLinks",
        "nvlinkBandwidthGBps",
        "numaNode",
        "resource.kubernetes.io/numaNode",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
    ];
    for device in &devices {
        assert_eq!(attribute(device, "type")["string"], "gpu");
        let names: BTreeSet<&str> = device["attributes"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(names, BTreeSet::from(implied), "{}", device["name"]);
        assert_eq!(
            device["capacity"]["memory"]["value"],
            (81559u64 << 20).to_string(),
            "memory in bytes"
        );
        assert_eq!(
            attribute(device, "cudaComputeCapability")["version"],
            "9.0.0"
        );
        assert_eq!(attribute(device, "driverVersion")["version"], "550.54.15");
    }
    let islands: BTreeSet<&str> = devices
        .iter()
        .map(|d| attribute(d, "nvlinkIsland")["string"].as_str().unwrap())
        .collect();
    assert_eq!(islands.len(), 1, "one shared nvlinkIsland");
    let numa: BTreeSet<i64> = devices
        .iter()
        .map(|d| {
            attribute(d, "resource.kubernetes.io/numaNode")["int"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(numa, BTreeSet::from([0, 1]), "two distinct NUMA nodes");
    for device in &devices {
        assert_eq!(
            attribute(device, "numaNode"),
            attribute(device, "resource.kubernetes.io/numaNode"),
            "the deprecated name carries the standard one's value"
        );
    }
}

#[test]
fn hgx_a100_mig_json_shows_mig_devices_and_no_mig_mode_gpu_whole() {
    let inventory = MockSource::new("hgx-a100-mig")
        .unwrap()
        .for_node("hgx-1")
        .inventory()
        .unwrap();
    let slices = inventory_json("hgx-a100-mig", &["--node-name", "hgx-1"]);
    let devices = devices(&slices);
    let names: BTreeSet<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    let mut mig_mode_uuids = BTreeSet::new();
    for gpu in &inventory.gpus {
        let whole = format!("gpu-{}", gpu.minor);
        if gpu.mig_enabled() {
            assert!(!names.contains(whole.as_str()), "{whole} is in MIG mode");
            mig_mode_uuids.insert(gpu.uuid.as_str());
        } else {
            assert!(names.contains(whole.as_str()), "{whole} is whole");
        }
    }
    let mig: Vec<&&Value> = devices
        .iter()
        .filter(|d| attribute(d, "type")["string"] == "mig")
        .collect();
    assert_eq!(mig.len(), 7 + 4 + 2 + 4);
    for device in mig {
        let profile = attribute(device, "profile")["string"].as_str().unwrap();
        assert!(profile.contains('g'), "{profile}");
        let parent = attribute(device, "parentUUID")["string"].as_str().unwrap();
        assert!(mig_mode_uuids.contains(parent), "{parent}");
        for engine in [
            "copyEngines",
            "decoders",
            "encoders",
            "jpegEngines",
            "ofaEngines",
        ] {
            assert!(
                device["capacity"][engine]["value"].is_string(),
                "{} lacks {engine}",
                device["name"]
            );
        }
        assert!(device["capacity"]["memory"]["value"].is_string());
    }
}

#[test]
fn dynamic_mig_on_1_35_gets_counter_slices() {
    let slices = inventory_json(
        "hgx-a100-mig",
        &[
            "--dynamic-mig",
            "--server-version",
            "1.35",
            "--topology-managed",
        ],
    );
    let counter_slices = slices
        .iter()
        .filter(|s| s["spec"]["sharedCounters"].is_array())
        .count();
    assert_eq!(counter_slices, 1);
    for device in devices(&slices) {
        assert_eq!(
            device["taints"][0]["key"],
            "gpu.tessera.dev/topology-managed"
        );
    }
}

#[test]
fn yaml_is_a_document_per_slice_and_table_a_row_per_device() {
    let out = tessera(&["inventory", "--topology", "pcie-l40s"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("---\n").count(), 1);
    assert!(text.contains("kind: ResourceSlice"));

    let out = tessera(&["inventory", "--topology", "dgx-h100", "-o", "table"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("gpu-")).collect();
    assert_eq!(rows.len(), 8, "{text}");
    assert!(
        rows[7].contains("nvl-") && rows[7].contains("pci0000:d7"),
        "{text}"
    );
}

#[test]
fn unknown_topology_lists_the_shipped_ones() {
    let out = tessera(&["inventory", "--topology", "dgx-z900"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("error: unknown topology `dgx-z900`"),
        "{stderr}"
    );
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(
        stderr.contains("dgx-h100, hgx-a100-mig, pcie-l40s"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn malformed_topology_file_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.yaml");
    let yaml = tessera_gpu_inventory::mock::shipped_topology("pcie-l40s")
        .unwrap()
        .replacen("multiprocessors: 142", "multiprocessors: many", 1);
    std::fs::write(&path, yaml).unwrap();
    let out = tessera(&["inventory", "--topology", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let location = format!("{}:15:22: field `gpus[0].multiprocessors`", path.display());
    assert!(stderr.contains(&location), "{stderr}");
    assert!(stderr.contains("expected u32"), "{stderr}");
}

#[test]
fn bad_flags_are_refused_by_the_parser() {
    for args in [
        vec!["inventory"],
        vec![
            "inventory",
            "--topology",
            "dgx-h100",
            "--server-version",
            "1.30",
        ],
        vec!["inventory", "--topology", "dgx-h100", "-o", "xml"],
        vec![
            "inventory",
            "--topology",
            "dgx-h100",
            "--node-name",
            "Bad_Name",
        ],
    ] {
        let out = tessera(&args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            !stderr.is_empty() && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_missing_nvml_library_is_a_clear_error() {
    let out = tessera(&[
        "inventory",
        "--nvml",
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/libnvidia-ml.so.1"),
        "{stderr}"
    );
    assert!(stderr.contains("NVIDIA driver"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The `uuid` attributes of `tessera inventory --topology dgx-h100 [extra]`, NODE_NAME unset.
fn dgx_h100_uuids(extra: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["inventory", "--topology", "dgx-h100", "-o", "json"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(&args)
        .env_remove("NODE_NAME")
        .output()
        .expect("the tessera binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slices: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    devices(slices.as_array().unwrap())
        .iter()
        .map(|d| attribute(d, "uuid")["string"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn node_name_gives_the_node_its_own_uuids() {
    let file: BTreeSet<String> = MockSource::new("dgx-h100")
        .unwrap()
        .inventory()
        .unwrap()
        .gpus
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    assert_eq!(
        dgx_h100_uuids(&[]),
        file,
        "no --node-name: the file's UUIDs"
    );
    let a = dgx_h100_uuids(&["--node-name", "node-a"]);
    let b = dgx_h100_uuids(&["--node-name", "node-b"]);
    assert_eq!((a.len(), b.len()), (8, 8));
    assert!(a.is_disjoint(&b) && a.is_disjoint(&file), "{a:?} {b:?}");
    assert_eq!(dgx_h100_uuids(&["--node-name", "node-a"]), a, "stable");
}
