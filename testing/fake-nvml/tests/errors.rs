//! Failure paths of the NVML backend: a missing library, a library that is not a complete NVML, a
//! driver that cannot initialise, a GPU that is lost, and an equality check that notices a
//! difference.

mod support;

use std::path::Path;

use tessera_fake_nvml::sysfs::write_fake_sysfs;
use tessera_fake_nvml::{LOST_GPUS_ENV, TOPOLOGY_ENV};
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_nvml::{NvmlError, NvmlSource, Sysfs};

use support::{fake_library, is_child, library_without_shutdown, run_in_child};

#[test]
fn a_missing_library_is_an_error_naming_the_path_and_the_fix() {
    let path = Path::new("/nonexistent/lib/libnvidia-ml.so.1");
    let err = NvmlSource::open(Some(path)).unwrap_err();
    assert!(matches!(err, NvmlError::LibraryNotLoaded { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/lib/libnvidia-ml.so.1"),
        "{text}"
    );
    assert!(text.contains("--nvml-lib"), "{text}");
    assert!(text.contains("NVIDIA driver"), "{text}");
}

#[test]
fn a_library_without_nvml_shutdown_is_refused_without_panicking() {
    let path = library_without_shutdown();
    assert!(path.is_file(), "build.rs builds {}", path.display());
    let err = NvmlSource::open(Some(&path)).unwrap_err();
    match &err {
        NvmlError::LibraryIncomplete { path: p, symbol } => {
            assert_eq!(p, &path);
            assert_eq!(*symbol, "nvmlShutdown");
        }
        other => panic!("expected LibraryIncomplete, got {other:?}"),
    }
    assert!(err.to_string().contains("nvmlShutdown"), "{err}");
}

#[test]
fn a_library_that_is_not_nvml_is_refused() {
    // The test executable's own C library: loadable, but no NVML in it.
    let err = NvmlSource::open(Some(Path::new("libc.so.6"))).unwrap_err();
    assert!(
        matches!(
            err,
            NvmlError::LibraryIncomplete {
                symbol: "nvmlInit_v2",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn init_without_a_topology_fails_with_the_init_error() {
    const TEST: &str = "init_without_a_topology_fails_with_the_init_error";
    if is_child(TEST) {
        // The child runs without TESSERA_FAKE_NVML_TOPOLOGY (run_in_child clears it).
        let err = NvmlSource::open(Some(&fake_library())).unwrap_err();
        assert!(matches!(err, NvmlError::Init { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("nvmlInit_v2"), "{text}");
        assert!(text.contains("libtessera_fake_nvml.so"), "{text}");
        return;
    }
    run_in_child(TEST, &[]).unwrap();
}

#[test]
fn a_lost_gpu_is_reported_lost_and_the_others_are_read() {
    const TEST: &str = "a_lost_gpu_is_reported_lost_and_the_others_are_read";
    let lost = "GPU-41a89231-70e2-5ba4-b5a0-3ebf0c2cf235";
    if is_child(TEST) {
        let sysfs = tempfile::tempdir().unwrap();
        let expected = MockSource::new("pcie-l40s").unwrap().inventory().unwrap();
        assert!(
            expected.gpu_by_uuid(lost).is_some(),
            "the test names a GPU of pcie-l40s"
        );
        write_fake_sysfs(sysfs.path(), &expected).unwrap();
        let nvml = NvmlSource::open(Some(&fake_library()))
            .unwrap()
            .with_sysfs(Sysfs::new(sysfs.path()));
        let read = nvml.read_inventory().unwrap();
        assert_eq!(read.lost_gpus, [lost]);
        assert!(read.gpu_by_uuid(lost).is_none(), "no facts for a lost GPU");
        let mut others = expected.clone();
        others.gpus.retain(|g| g.uuid != lost);
        assert_eq!(read.gpus, others.gpus, "every other GPU is read in full");
        // Through the DeviceSource trait the inventory is validated and arrives the same.
        let validated = nvml.inventory().unwrap();
        assert_eq!(validated, read);
        return;
    }
    run_in_child(
        TEST,
        &[
            (TOPOLOGY_ENV, "pcie-l40s".to_owned()),
            (LOST_GPUS_ENV, lost.to_owned()),
        ],
    )
    .unwrap();
}

/// The equality test compares what it should: a fake answering from a different file is caught.
#[test]
fn a_difference_between_nvml_and_mock_is_reported() {
    const TEST: &str = "a_difference_between_nvml_and_mock_is_reported";
    if is_child(TEST) {
        let expected = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
        let sysfs = tempfile::tempdir().unwrap();
        write_fake_sysfs(sysfs.path(), &expected).unwrap();
        let actual = NvmlSource::open(Some(&fake_library()))
            .unwrap()
            .with_sysfs(Sysfs::new(sysfs.path()))
            .inventory()
            .unwrap();
        assert_eq!(actual, expected);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("dgx-h100-changed.yaml");
    let yaml = tessera_gpu_inventory::mock::shipped_topology("dgx-h100").unwrap();
    let edited = yaml.replacen("minor: 3", "minor: 33", 1);
    assert_ne!(edited, yaml);
    std::fs::write(&changed, edited).unwrap();
    let failure = run_in_child(TEST, &[(TOPOLOGY_ENV, changed.display().to_string())])
        .expect_err("the child sees minor 33 through NVML and 3 through mock");
    assert!(failure.contains("minor: 33"), "{failure}");
}
