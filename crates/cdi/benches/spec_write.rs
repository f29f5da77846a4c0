//! Cost of the durable spec operations a prepare/unprepare pays: an atomic write of a
//! one-GPU claim spec (temp file, fsync, rename, directory fsync) and its removal.
//!
//! Run with `cargo bench -p tessera-cdi`; the numbers depend on the file system of the temp
//! directory (set TMPDIR to measure another one).

use criterion::{Criterion, criterion_group, criterion_main};
use tessera_cdi::{ContainerEdits, Device, DeviceNode, Kind, Spec, SpecDir};

fn claim_spec(kind: &Kind, claim_uid: &str) -> Spec {
    Spec::new(
        kind.clone(),
        vec![Device {
            name: format!("{claim_uid}-gpu-0"),
            container_edits: ContainerEdits {
                env: vec![
                    "NVIDIA_VISIBLE_DEVICES=GPU-6f3e0b4e-1c1d-4a52-8d1e-2b3c4d5e6f70".into(),
                    "CUDA_VISIBLE_DEVICES=GPU-6f3e0b4e-1c1d-4a52-8d1e-2b3c4d5e6f70".into(),
                ],
                device_nodes: vec![
                    DeviceNode {
                        path: "/dev/nvidia0".into(),
                        ..Default::default()
                    },
                    DeviceNode {
                        path: "/dev/nvidiactl".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            },
        }],
    )
}

fn spec_write(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("temporary directory");
    let kind = Kind::new("gpu.tessera.dev", "claim").expect("valid kind");
    let specs = SpecDir::new(root.path(), kind.clone());
    let uid = "0b8e7c1a-3c5e-4d0e-9a57-3c1f4a2b9d10";
    let spec = claim_spec(&kind, uid);

    c.bench_function("write claim spec (fsync)", |b| {
        b.iter(|| specs.write(uid, &spec).expect("write"));
    });
    c.bench_function("write + remove claim spec (fsync)", |b| {
        b.iter(|| {
            specs.write(uid, &spec).expect("write");
            specs.remove(uid).expect("remove")
        });
    });
}

criterion_group!(benches, spec_write);
criterion_main!(benches);
