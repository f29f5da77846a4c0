//! Scripted telemetry through the NVML backend on the fake: the samples file's values come out of
//! `NvmlSource::telemetry` (nvml-wrapper's `utilization_rates`, `memory_info`, `power_usage`,
//! `temperature`, `total_ecc_errors`), a rewrite is seen at the next sample, a GPU in MIG mode
//! reports no utilization and a lost GPU reports failures instead of values.

mod support;

use tessera_fake_nvml::{LOST_GPUS_ENV, SAMPLES_ENV, TOPOLOGY_ENV};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_nvml::{GpuTelemetry, NvmlSource};

use support::{fake_library, is_child, run_in_child};

const MIB: u64 = 1 << 20;

fn by_uuid<'a>(gpus: &'a [GpuTelemetry], uuid: &str) -> &'a GpuTelemetry {
    gpus.iter()
        .find(|g| g.uuid == uuid)
        .unwrap_or_else(|| panic!("no sample of {uuid}"))
}

/// Writes the samples file through a new file and a rename, as a test script would.
fn script(path: &str, text: &str) {
    let next = format!("{path}.new");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// The samples scripted by [`scripted_samples_are_read_through_nvml_wrapper`] as read: GPU 4's
/// own line, GPU 5 the `*` line and zeros, GPU 0 (MIG mode) no utilization and no failure, the
/// lost GPU failures only.
fn assert_the_scripted_samples(gpus: &[GpuTelemetry], inventory: &GpuInventory, lost: &str) {
    let (mig_gpu, plain, other) = (&inventory.gpus[0], &inventory.gpus[4], &inventory.gpus[5]);
    let busy = by_uuid(gpus, &plain.uuid);
    assert_eq!(busy.utilization_percent, Some(80));
    assert_eq!(busy.memory_utilization_percent, Some(35));
    assert_eq!(busy.memory_used_bytes, Some(1024 * MIB));
    assert_eq!(busy.power_milliwatts, Some(90_000));
    assert_eq!(busy.temperature_celsius, Some(61));
    assert_eq!(
        (busy.ecc_corrected, busy.ecc_uncorrected),
        (Some(2), Some(1))
    );
    let quiet = by_uuid(gpus, &other.uuid);
    assert_eq!(quiet.utilization_percent, Some(3), "the `*` line");
    assert_eq!(
        quiet.temperature_celsius,
        Some(0),
        "unscripted fields read 0"
    );
    let mig = by_uuid(gpus, &mig_gpu.uuid);
    assert_eq!(
        mig.utilization_percent, None,
        "a GPU in MIG mode reports no utilization, as NVML does"
    );
    assert!(
        mig.failures.is_empty(),
        "not supported is not a failure: {:?}",
        mig.failures
    );
    assert_eq!(mig.power_milliwatts, Some(90_000));
    let gone = by_uuid(gpus, lost);
    assert_eq!(gone.utilization_percent, None);
    assert_eq!(gone.failures.len(), 6, "{:?}", gone.failures);
}

#[test]
fn scripted_samples_are_read_through_nvml_wrapper() {
    const TEST: &str = "scripted_samples_are_read_through_nvml_wrapper";
    let inventory = MockSource::new("hgx-a100-mig")
        .unwrap()
        .inventory()
        .unwrap();
    let lost = &inventory.gpus[7].uuid;
    if !is_child(TEST) {
        let dir = tempfile::tempdir().unwrap();
        let samples = dir.path().join("samples");
        return run_in_child(
            TEST,
            &[
                (TOPOLOGY_ENV, "hgx-a100-mig".to_owned()),
                (SAMPLES_ENV, samples.display().to_string()),
                (LOST_GPUS_ENV, lost.clone()),
            ],
        )
        .unwrap();
    }
    let samples = std::env::var(SAMPLES_ENV).unwrap();
    let mig_gpu = &inventory.gpus[0];
    assert!(
        mig_gpu.mig_enabled(),
        "hgx-a100-mig has GPUs 0-3 in MIG mode, 4-7 not"
    );
    let plain = &inventory.gpus[4];
    let other = &inventory.gpus[5];
    let nvml = NvmlSource::open(Some(&fake_library())).unwrap();

    // No file yet: zeros, and the memory the inventory has.
    let gpus = nvml.telemetry().unwrap();
    assert_eq!(gpus.len(), 8);
    let first = by_uuid(&gpus, &plain.uuid);
    assert_eq!(first.utilization_percent, Some(0));
    assert_eq!(first.memory_used_bytes, Some(0));
    assert_eq!(first.memory_total_bytes, Some(plain.memory_bytes));
    assert_eq!(first.ecc_uncorrected, Some(0));
    assert!(first.failures.is_empty(), "{:?}", first.failures);

    script(
        &samples,
        &format!(
            "* utilization=3 power-watts=90\n{} utilization=80 memory-utilization=35 \
             memory-used-mib=1024 temperature=61 ecc-corrected=2 ecc-uncorrected=1\n",
            plain.uuid
        ),
    );
    assert_the_scripted_samples(&nvml.telemetry().unwrap(), &inventory, lost);

    // A rewrite is seen at the next sample.
    script(&samples, &format!("{} utilization=0\n", plain.uuid));
    let gpus = nvml.telemetry().unwrap();
    assert_eq!(by_uuid(&gpus, &plain.uuid).utilization_percent, Some(0));
    assert_eq!(by_uuid(&gpus, &other.uuid).utilization_percent, Some(0));
}
