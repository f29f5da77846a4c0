//! Health events through the NVML backend on the fake: lines appended to the injection file come
//! out of `HealthEvents::wait`.

mod support;

use std::io::Write;
use std::time::Duration;

use tessera_fake_nvml::{EVENTS_ENV, TOPOLOGY_ENV};
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_nvml::{HealthEvent, HealthEventKind, NvmlSource};

use support::{fake_library, is_child, run_in_child};

const WAIT: Duration = Duration::from_secs(5);

/// The file the fake reads injected events from (named by `EVENTS_ENV`), opened for appending.
fn injection_file() -> std::fs::File {
    let path = std::env::var(EVENTS_ENV).unwrap();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

#[test]
fn injected_xid_and_ecc_events_are_delivered() {
    const TEST: &str = "injected_xid_and_ecc_events_are_delivered";
    if !is_child(TEST) {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events");
        return run_in_child(
            TEST,
            &[
                (TOPOLOGY_ENV, "hgx-a100-mig".to_owned()),
                (EVENTS_ENV, events.display().to_string()),
            ],
        )
        .unwrap();
    }
    let inventory = MockSource::new("hgx-a100-mig")
        .unwrap()
        .inventory()
        .unwrap();
    let gpu1 = &inventory.gpus[1].uuid;
    let gpu6 = &inventory.gpus[6].uuid;
    let mig = &inventory.gpus[0].mig.as_ref().unwrap().instances[2];

    let nvml = NvmlSource::open(Some(&fake_library())).unwrap();
    let mut events = nvml.health_events().unwrap();
    assert!(
        events.unmonitored().is_empty(),
        "{:?}",
        events.unmonitored()
    );
    assert_eq!(events.monitored().count(), 8);
    assert_eq!(
        events.wait(Duration::from_millis(30)).unwrap(),
        None,
        "nothing yet"
    );

    let mut file = injection_file();
    writeln!(file, "xid {gpu1} 79").unwrap();
    writeln!(file, "xid {} 31", mig.uuid).unwrap();
    writeln!(file, "ecc-double {gpu6}").unwrap();
    file.flush().unwrap();

    assert_eq!(
        events.wait(WAIT).unwrap(),
        Some(HealthEvent {
            gpu_uuid: gpu1.clone(),
            kind: HealthEventKind::Xid(79),
            gpu_instance_id: None,
            compute_instance_id: None,
        })
    );
    assert_eq!(
        events.wait(WAIT).unwrap(),
        Some(HealthEvent {
            gpu_uuid: inventory.gpus[0].uuid.clone(),
            kind: HealthEventKind::Xid(31),
            gpu_instance_id: Some(mig.gpu_instance_id),
            compute_instance_id: Some(mig.compute_instance_id),
        })
    );
    assert_eq!(
        events.wait(WAIT).unwrap(),
        Some(HealthEvent {
            gpu_uuid: gpu6.clone(),
            kind: HealthEventKind::DoubleBitEcc,
            gpu_instance_id: None,
            compute_instance_id: None,
        })
    );
    assert_eq!(events.wait(Duration::from_millis(30)).unwrap(), None);

    // The event set can move to another thread (the node plugin waits on a blocking thread).
    writeln!(file, "ecc-single {gpu1}").unwrap();
    let waited = std::thread::spawn(move || events.wait(WAIT).unwrap())
        .join()
        .unwrap();
    assert_eq!(waited.map(|e| e.kind), Some(HealthEventKind::SingleBitEcc));
}
