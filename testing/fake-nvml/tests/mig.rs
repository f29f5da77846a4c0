//! Dynamic MIG through the NVML backend on the fake: create a MIG device at a placement, see it in
//! the listings and the inventory, get refused where slices are taken, destroy it again.

mod support;

use tessera_fake_nvml::TOPOLOGY_ENV;
use tessera_fake_nvml::sysfs::write_fake_sysfs;
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_nvml::{NvmlError, NvmlSource, Sysfs};

use support::{fake_library, is_child, run_in_child};

/// hgx-a100-mig: GPU 3 has 1g.20gb@0, 1g.10gb+me@2, 2g.20gb@4, 1g.20gb@6; memory slice 3 is free.
/// GPU 4 is MIG-capable with MIG disabled.
const TOPOLOGY: &str = "hgx-a100-mig";

fn open() -> (NvmlSource, tempfile::TempDir) {
    let sysfs = tempfile::tempdir().unwrap();
    let inventory = MockSource::new(TOPOLOGY).unwrap().inventory().unwrap();
    write_fake_sysfs(sysfs.path(), &inventory).unwrap();
    let nvml = NvmlSource::open(Some(&fake_library()))
        .unwrap()
        .with_sysfs(Sysfs::new(sysfs.path()));
    (nvml, sysfs)
}

fn gpu_uuid(nvml: &NvmlSource, index: usize) -> String {
    nvml.read_inventory().unwrap().gpus[index].uuid.clone()
}

#[test]
fn mig_devices_are_created_listed_and_destroyed() {
    const TEST: &str = "mig_devices_are_created_listed_and_destroyed";
    if !is_child(TEST) {
        return run_in_child(TEST, &[(TOPOLOGY_ENV, TOPOLOGY.to_owned())]).unwrap();
    }
    let (nvml, _sysfs) = open();
    let gpu = gpu_uuid(&nvml, 3);
    let before = nvml.mig_devices(&gpu).unwrap();
    assert_eq!(before.len(), 4);

    let created = nvml.create_mig_device(&gpu, "1g.10gb", 3).unwrap();
    assert!(created.uuid.starts_with("MIG-"), "{created:?}");
    assert_eq!(created.profile, "1g.10gb");
    assert_eq!(created.placement_start, 3);
    assert!(
        before
            .iter()
            .all(|existing| existing.gpu_instance_id != created.gpu_instance_id),
        "a new GPU instance id"
    );
    assert_eq!(created.memory_bytes, 9728 << 20);
    assert_eq!(created.multiprocessors, 14);

    let after = nvml.mig_devices(&gpu).unwrap();
    assert_eq!(after.len(), 5);
    assert!(after.contains(&created));
    // The inventory shows it too, and still passes validation.
    let inventory = nvml.inventory().unwrap();
    let instances = &inventory.gpus[3].mig.as_ref().unwrap().instances;
    assert!(instances.contains(&created));

    nvml.destroy_mig_device(&gpu, created.gpu_instance_id, created.compute_instance_id)
        .unwrap();
    assert_eq!(nvml.mig_devices(&gpu).unwrap(), before);
    let again = nvml
        .destroy_mig_device(&gpu, created.gpu_instance_id, created.compute_instance_id)
        .unwrap_err();
    assert!(
        matches!(again, NvmlError::UnknownMigDevice { .. }),
        "{again:?}"
    );

    // The slice is free again: the same placement can be created once more.
    let recreated = nvml.create_mig_device(&gpu, "1g.10gb", 3).unwrap();
    assert_ne!(
        recreated.uuid, created.uuid,
        "a new MIG device gets a new UUID"
    );
}

#[test]
fn placements_that_overlap_or_do_not_exist_are_refused() {
    const TEST: &str = "placements_that_overlap_or_do_not_exist_are_refused";
    if !is_child(TEST) {
        return run_in_child(TEST, &[(TOPOLOGY_ENV, TOPOLOGY.to_owned())]).unwrap();
    }
    let (nvml, _sysfs) = open();
    let gpu = gpu_uuid(&nvml, 3);

    // Slice 4 is taken by 2g.20gb@4.
    let taken = nvml.create_mig_device(&gpu, "1g.10gb", 4).unwrap_err();
    assert!(
        matches!(taken, NvmlError::MigPlacementUnavailable { start: 4, .. }),
        "{taken:?}"
    );
    assert!(
        taken
            .to_string()
            .contains("NVML_ERROR_INSUFFICIENT_RESOURCES"),
        "{taken}"
    );

    let nowhere = nvml.create_mig_device(&gpu, "3g.40gb", 2).unwrap_err();
    match &nowhere {
        NvmlError::InvalidMigPlacement { valid, .. } => assert_eq!(valid, "0, 4"),
        other => panic!("expected InvalidMigPlacement, got {other:?}"),
    }

    let unknown = nvml.create_mig_device(&gpu, "9g.999gb", 0).unwrap_err();
    match &unknown {
        NvmlError::UnknownMigProfile { available, .. } => {
            assert!(available.contains("1g.10gb"), "{available}")
        }
        other => panic!("expected UnknownMigProfile, got {other:?}"),
    }

    // MIG mode is off on GPU 4: NVML refuses, and the error names GPU and profile.
    let gpu4 = gpu_uuid(&nvml, 4);
    let disabled = nvml.create_mig_device(&gpu4, "1g.10gb", 0).unwrap_err();
    assert!(
        matches!(disabled, NvmlError::MigCreate { .. }),
        "{disabled:?}"
    );
    let text = disabled.to_string();
    assert!(text.contains(&gpu4) && text.contains("1g.10gb"), "{text}");

    let missing = nvml
        .mig_devices("GPU-00000000-0000-0000-0000-000000000000")
        .unwrap_err();
    assert!(
        matches!(missing, NvmlError::UnknownGpu { .. }),
        "{missing:?}"
    );

    // Nothing was left behind by the refused attempts.
    assert_eq!(nvml.mig_devices(&gpu).unwrap().len(), 4);
}
