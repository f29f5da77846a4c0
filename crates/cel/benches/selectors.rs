//! Cost of evaluating typical DeviceClass selectors on one device, of compiling them, and of
//! building the `device` variable.
//!
//! `cargo bench -p tessera-cel --bench selectors`; figures in docs/benchmarks.md. On a machine
//! shared with other work, run the built bench binary under a real-time scheduling class so
//! that the figures measure the code, not the waits for a core (see docs/benchmarks.md).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_cel::{AttributeValue, DeviceContext, DeviceView, SelectorCompiler};

const TYPE_CHECK: &str = r#"device.attributes["gpu.tessera.dev"].type == "gpu""#;
const PRODUCT_NAME: &str =
    r#"device.attributes["gpu.tessera.dev"].productName.matches("^NVIDIA H100")"#;
const MEMORY: &str =
    r#"device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0"#;
const DRIVER_VERSION: &str =
    r#"device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("535.0.0"))"#;

fn combined() -> String {
    [TYPE_CHECK, PRODUCT_NAME, MEMORY, DRIVER_VERSION].join(" && ")
}

/// Attributes and capacities of a device, as `DeviceContext::from_parts` takes them.
type Parts = (Vec<(String, AttributeValue)>, Vec<(String, String)>);

/// A device as Tessera publishes a whole H100: 18 attributes, 2 capacities.
fn h100_parts() -> Parts {
    let s = |v: &str| AttributeValue::String(v.to_owned());
    let v = |v: &str| AttributeValue::Version(v.to_owned());
    let attributes = [
        ("type", s("gpu")),
        ("uuid", s("GPU-6a2c1f0e-8a43-4b5c-9d3e-0123456789ab")),
        ("productName", s("NVIDIA H100 80GB HBM3")),
        ("brand", s("Nvidia")),
        ("architecture", s("Hopper")),
        ("index", AttributeValue::Int(3)),
        ("minor", AttributeValue::Int(3)),
        ("cudaComputeCapability", v("9.0.0")),
        ("driverVersion", v("550.54.15")),
        ("cudaDriverVersion", v("12.4.0")),
        ("migCapable", AttributeValue::Bool(true)),
        ("migEnabled", AttributeValue::Bool(false)),
        ("nvlinkIsland", s("node-a-island-0")),
        ("nvlinkLinks", AttributeValue::Int(18)),
        ("nvlinkBandwidthGBps", AttributeValue::Int(900)),
        ("numaNode", AttributeValue::Int(0)),
        ("resource.kubernetes.io/pciBusID", s("0000:1b:00.0")),
        ("resource.kubernetes.io/pcieRoot", s("pci0000:1a")),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v))
    .collect();
    let capacity = vec![
        ("memory".to_owned(), "80Gi".to_owned()),
        ("multiprocessors".to_owned(), "132".to_owned()),
    ];
    (attributes, capacity)
}

fn h100() -> DeviceContext {
    let (attributes, capacity) = h100_parts();
    DeviceContext::from_parts("gpu.tessera.dev", false, attributes, capacity)
}

fn evaluation(c: &mut Criterion) {
    let compiler = SelectorCompiler::new();
    let device = h100();
    let combined = combined();
    let mut group = c.benchmark_group("evaluate");
    for (name, expression) in [
        ("type check", TYPE_CHECK),
        ("productName match", PRODUCT_NAME),
        ("memory quantity compare", MEMORY),
        ("driverVersion semver compare", DRIVER_VERSION),
        ("all combined", combined.as_str()),
    ] {
        let selector = compiler
            .compile(expression)
            .expect("benchmark selectors compile");
        assert_eq!(selector.evaluate(&device), Ok(true), "{name}");
        group.bench_function(name, |b| {
            b.iter(|| black_box(&selector).evaluate(black_box(&device)))
        });
    }
    group.finish();
}

fn compilation(c: &mut Criterion) {
    let combined = combined();
    let mut group = c.benchmark_group("compile");
    for (name, expression) in [
        ("type check", TYPE_CHECK),
        ("all combined", combined.as_str()),
    ] {
        group.bench_function(format!("{name} (uncached)"), |b| {
            b.iter(|| SelectorCompiler::new().compile(black_box(expression)))
        });
    }
    let cached = SelectorCompiler::new();
    group.bench_function("all combined (cached)", |b| {
        b.iter(|| cached.compile(black_box(&combined)))
    });
    group.finish();
}

fn device_context(c: &mut Criterion) {
    let (attributes, capacity) = h100_parts();
    c.bench_function("device context (18 attributes, 2 capacities)", |b| {
        b.iter(|| {
            DeviceContext::from_parts(
                "gpu.tessera.dev",
                false,
                black_box(attributes.clone()),
                black_box(capacity.clone()),
            )
        })
    });
}

/// The same H100 as the API object the allocator holds.
fn h100_api() -> Device {
    let (attributes, capacity) = h100_parts();
    let attribute = |v: AttributeValue| match v {
        AttributeValue::Int(i) => DeviceAttribute {
            int: Some(i),
            ..Default::default()
        },
        AttributeValue::Bool(b) => DeviceAttribute {
            bool: Some(b),
            ..Default::default()
        },
        AttributeValue::String(s) => DeviceAttribute {
            string: Some(s),
            ..Default::default()
        },
        AttributeValue::Version(v) => DeviceAttribute {
            version: Some(v),
            ..Default::default()
        },
        other => unreachable!("the H100 has no list attribute: {other:?}"),
    };
    Device {
        name: "gpu-3".to_owned(),
        attributes: Some(
            attributes
                .into_iter()
                .map(|(n, v)| (n, attribute(v)))
                .collect(),
        ),
        capacity: Some(
            capacity
                .into_iter()
                .map(|(n, q)| {
                    let value = DeviceCapacity {
                        value: Quantity(q),
                        ..Default::default()
                    };
                    (n, value)
                })
                .collect(),
        ),
        ..Default::default()
    }
}

/// A class selector meeting a device for the first time (what the allocator pays once per
/// device): building the whole `device` variable and evaluating, or evaluating on a view of the
/// API object.
fn first_evaluation(c: &mut Criterion) {
    let device = h100_api();
    let selector = SelectorCompiler::new()
        .compile(TYPE_CHECK)
        .expect("benchmark selectors compile");
    assert!(selector.reads_paths_only());
    let mut group = c.benchmark_group("first evaluation on a device");
    group.bench_function("DeviceContext::new + evaluate", |b| {
        b.iter(|| {
            let context = DeviceContext::new("gpu.tessera.dev", black_box(&device));
            selector.evaluate(&context)
        })
    });
    group.bench_function("DeviceView::new + evaluate_view", |b| {
        b.iter(|| {
            let view = DeviceView::new("gpu.tessera.dev", black_box(&device));
            selector.evaluate_view(&view)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    evaluation,
    compilation,
    device_context,
    first_evaluation
);
criterion_main!(benches);
