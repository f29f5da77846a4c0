//! Compiles arbitrary text as a device selector and evaluates it on a few devices. Nothing may
//! panic, overflow the stack, run away in time or memory: every outcome is a value or an error.

#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tessera_cel::{AttributeValue, DeviceContext, SelectorCompiler};

static COMPILER: LazyLock<SelectorCompiler> = LazyLock::new(|| SelectorCompiler::with_cache_capacity(64));

static DEVICES: LazyLock<Vec<DeviceContext>> = LazyLock::new(|| {
    let s = |v: &str| AttributeValue::String(v.to_owned());
    vec![
        DeviceContext::from_parts("", false, [], []),
        DeviceContext::from_parts(
            "gpu.tessera.dev",
            true,
            [
                ("type".to_owned(), s("gpu")),
                ("productName".to_owned(), s("NVIDIA H100 80GB HBM3")),
                ("architecture".to_owned(), s("Hopper")),
                ("index".to_owned(), AttributeValue::Int(3)),
                ("migCapable".to_owned(), AttributeValue::Bool(true)),
                ("driverVersion".to_owned(), AttributeValue::Version("550.54.15".to_owned())),
                ("cudaComputeCapability".to_owned(), AttributeValue::Version("9.0.0".to_owned())),
                ("nvlinkIsland".to_owned(), s("island-0")),
                ("resource.kubernetes.io/pcieRoot".to_owned(), s("pci0000:00")),
                ("resource.kubernetes.io/numaNode".to_owned(), AttributeValue::Int(0)),
            ],
            [
                ("memory".to_owned(), "80Gi".to_owned()),
                ("multiprocessors".to_owned(), "132".to_owned()),
            ],
        ),
        DeviceContext::from_parts(
            "dra.example.com",
            false,
            [
                ("names".to_owned(), AttributeValue::Strings(vec!["a".into(), "bb".into(), "".into()])),
                ("ints".to_owned(), AttributeValue::Ints(vec![i64::MIN, -1, 0, i64::MAX])),
                ("bools".to_owned(), AttributeValue::Bools(vec![true, false])),
                ("versions".to_owned(), AttributeValue::Versions(vec!["1.0.0-rc.1+b".into(), "0.0.0".into()])),
                ("other.vendor/x".to_owned(), s("\u{1F600}é\0")),
            ],
            [("huge".to_owned(), "8Ei".to_owned()), ("tiny".to_owned(), "-1n".to_owned())],
        ),
    ]
});

fuzz_target!(|data: &[u8]| {
    let expression = String::from_utf8_lossy(data);
    if let Ok(selector) = COMPILER.compile(&expression) {
        let _ = selector.estimated_cost();
        for device in DEVICES.iter() {
            let _ = selector.evaluate(device);
        }
    }
});
