//! The CI test of issue 2: for every shipped topology, the inventory read through the `nvml`
//! backend — nvml-wrapper and nvml-wrapper-sys calling `libtessera_fake_nvml.so` — equals the one
//! the `mock` backend reads from the same file. Each topology runs in its own process.

mod support;

use std::path::Path;

use pretty_assertions::assert_eq;
use tessera_fake_nvml::TOPOLOGY_ENV;
use tessera_fake_nvml::sysfs::write_fake_sysfs;
use tessera_gpu_inventory::mock::SHIPPED_TOPOLOGIES;
use tessera_gpu_inventory::{DeviceSource, MockSource, NvLinkState};
use tessera_nvml::{NvmlSource, Sysfs};

use support::{fake_library, is_child, run_in_child};

/// Runs [`compare_backends`] in a child process for each `(name, yaml)`; all failures reported.
fn compare_in_children(test: &str, topologies: &[(String, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let failures: Vec<String> = topologies
        .iter()
        .filter_map(|(name, yaml)| {
            // The fake reads a topology *file*, as a user would point it at one.
            let path = dir.path().join(format!("{name}.yaml"));
            std::fs::write(&path, yaml).unwrap();
            run_in_child(test, &[(TOPOLOGY_ENV, path.display().to_string())]).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// In a child: the topology file the fake answers from, read by both backends.
fn compare_backends() {
    let path = std::env::var(TOPOLOGY_ENV).unwrap();
    let expected = MockSource::from_file(Path::new(&path)).inventory().unwrap();
    let sysfs = tempfile::tempdir().unwrap();
    write_fake_sysfs(sysfs.path(), &expected).unwrap();
    let nvml = NvmlSource::open(Some(&fake_library()))
        .unwrap()
        .with_sysfs(Sysfs::new(sysfs.path()));
    let actual = nvml
        .inventory()
        .unwrap_or_else(|e| panic!("{path} through NVML: {e}"));
    assert_eq!(actual, expected, "topology {path}");
}

#[test]
fn nvml_on_fake_nvml_reads_what_mock_reads_for_every_shipped_topology() {
    const TEST: &str = "nvml_on_fake_nvml_reads_what_mock_reads_for_every_shipped_topology";
    if is_child(TEST) {
        return compare_backends();
    }
    let shipped: Vec<(String, String)> = SHIPPED_TOPOLOGIES
        .iter()
        .map(|(name, yaml)| ((*name).to_owned(), (*yaml).to_owned()))
        .collect();
    assert_eq!(shipped.len(), 5);
    compare_in_children(TEST, &shipped);
}

/// Variants the shipped files do not contain: inactive links, MIG on with no instances.
#[test]
fn nvml_on_fake_nvml_reads_what_mock_reads_for_edge_cases() {
    const TEST: &str = "nvml_on_fake_nvml_reads_what_mock_reads_for_edge_cases";
    if is_child(TEST) {
        return compare_backends();
    }
    let pairs = tessera_gpu_inventory::mock::shipped_topology("pcie-a100-nvlink-pairs").unwrap();
    let inactive = pairs.replacen("state: active", "state: inactive", 2);
    let mig = tessera_gpu_inventory::mock::shipped_topology("hgx-a100-mig").unwrap();
    let mut inventory = tessera_gpu_inventory::parse_topology("hgx-a100-mig", mig).unwrap();
    for gpu in &mut inventory.gpus {
        if let Some(mig) = &mut gpu.mig {
            mig.enabled = true;
            mig.instances.clear();
        }
    }
    let mig_empty = serde_yaml::to_string(&inventory).unwrap();
    let parsed = tessera_gpu_inventory::parse_topology("inactive", &inactive).unwrap();
    let inactive_links = parsed.gpus.iter().flat_map(|g| &g.nvlinks);
    assert_eq!(
        inactive_links
            .filter(|l| l.state == NvLinkState::Inactive)
            .count(),
        2
    );
    compare_in_children(
        TEST,
        &[
            ("inactive-links".to_owned(), inactive),
            ("mig-enabled-empty".to_owned(), mig_empty),
        ],
    );
}
