//! The CI test of issue 2: for every shipped topology, the inventory read through the `nvml`
//! backend — nvml-wrapper and nvml-wrapper-sys calling `libtessera_fake_nvml.so` — equals the one
//! the `mock` backend reads from the same file. Each topology runs in its own process.

mod support;

use pretty_assertions::assert_eq;
use tessera_fake_nvml::TOPOLOGY_ENV;
use tessera_fake_nvml::sysfs::write_fake_sysfs;
use tessera_topology::mock::{SHIPPED_TOPOLOGIES, shipped_topology};
use tessera_topology::nvml::{NvmlSource, Sysfs};
use tessera_topology::{DeviceSource, MockSource};

use support::{fake_library, is_child, run_in_child};

/// Which shipped topology a child compares.
const TOPOLOGY_NAME_ENV: &str = "TESSERA_TEST_TOPOLOGY_NAME";

#[test]
fn nvml_on_fake_nvml_reads_what_mock_reads_for_every_shipped_topology() {
    const TEST: &str = "nvml_on_fake_nvml_reads_what_mock_reads_for_every_shipped_topology";
    if is_child(TEST) {
        compare_backends(&std::env::var(TOPOLOGY_NAME_ENV).unwrap());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let failures: Vec<String> = SHIPPED_TOPOLOGIES
        .iter()
        .filter_map(|(name, yaml)| {
            // The fake reads a topology *file*, as a user would point it at one.
            let path = dir.path().join(format!("{name}.yaml"));
            std::fs::write(&path, yaml).unwrap();
            run_in_child(
                TEST,
                &[
                    (TOPOLOGY_ENV, path.display().to_string()),
                    (TOPOLOGY_NAME_ENV, (*name).to_owned()),
                ],
            )
            .err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(
        SHIPPED_TOPOLOGIES.len(),
        5,
        "a topology was added: still covered"
    );
}

fn compare_backends(name: &str) {
    let expected = MockSource::new(name).unwrap().inventory().unwrap();
    assert!(shipped_topology(name).is_some());
    let sysfs = tempfile::tempdir().unwrap();
    write_fake_sysfs(sysfs.path(), &expected).unwrap();
    let nvml = NvmlSource::open(Some(&fake_library()))
        .unwrap()
        .with_sysfs(Sysfs::new(sysfs.path()));
    let actual = nvml
        .inventory()
        .unwrap_or_else(|e| panic!("{name} through NVML: {e}"));
    assert_eq!(actual, expected, "topology {name}");
}
