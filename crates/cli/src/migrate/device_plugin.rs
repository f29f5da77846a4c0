//! NVIDIA device-plugin configs (`version: v1`: `flags`, `sharing.timeSlicing`, `sharing.mps`)
//! turned into Tessera chart values. Pure: a config in, a values fragment and notes out.
//!
//! | device plugin | Tessera chart value |
//! |---|---|
//! | `sharing.timeSlicing.resources[name: nvidia.com/gpu].replicas: N` | `kubeletPlugin.sharing.consumableShares: N` (N equal shares per GPU, time-sliced) |
//! | `sharing.mps.resources[name: nvidia.com/gpu].replicas: N` | the same, plus an MPS config on the claims (noted: MPS is a claim or DeviceClass config in DRA) |
//! | `sharing.*.renameByDefault: true` | `extendedResources.sharedGpu: nvidia.com/gpu.shared` |
//! | `flags.migStrategy: mixed` | `extendedResources.migPrefix: nvidia.com/mig-` |
//! | `flags.nvidiaDriverRoot`, `flags.nvidiaDevRoot` | `kubeletPlugin.driverRoot`, `kubeletPlugin.devRoot` |
//!
//! Everything else is reported as not carried over, with what to do instead.

use serde_yaml::{Mapping, Value};

use super::notes::Notes;

/// Most equal shares the chart accepts per device.
pub const MAX_SHARES: i64 = 48;
const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Whether `value` is a device-plugin config (not a Kubernetes object).
pub fn is_device_plugin_config(value: &Value) -> bool {
    value.get("apiVersion").is_none()
        && value.get("kind").is_none()
        && value.get("version").and_then(Value::as_str) == Some("v1")
        && (value.get("sharing").is_some()
            || value.get("flags").is_some()
            || value.get("resources").is_some())
}

/// Sets `path` (dotted) in `values`.
fn set(values: &mut Mapping, path: &[&str], value: Value) {
    let (last, parents) = path.split_last().expect("a non-empty path");
    let mut map = values;
    for key in parents {
        let entry = map
            .entry(Value::from(*key))
            .or_insert_with(|| Value::Mapping(Mapping::new()));
        if !entry.is_mapping() {
            *entry = Value::Mapping(Mapping::new());
        }
        map = entry.as_mapping_mut().expect("just made a mapping");
    }
    map.insert(Value::from(*last), value);
}

/// Converts one device-plugin config into chart values (merged into `values`).
pub fn migrate_config(config: &Value, values: &mut Mapping, notes: &mut Notes) {
    if let Some(flags) = config.get("flags") {
        migrate_flags(flags, values, notes);
    }
    note_unsupported_sections(config, notes);
    let Some(sharing) = config.get("sharing") else {
        return;
    };
    // The first `nvidia.com/gpu` replica count taken, and where it came from: one node group
    // has one number of shares.
    let mut chosen: Option<(String, i64)> = None;
    for strategy in ["timeSlicing", "mps"] {
        let Some(replicated) = sharing.get(strategy) else {
            continue;
        };
        let path = format!("sharing.{strategy}");
        migrate_strategy_options(&path, replicated, values, notes);
        let resources = replicated
            .get("resources")
            .and_then(Value::as_sequence)
            .cloned()
            .unwrap_or_default();
        for (i, resource) in resources.iter().enumerate() {
            let path = format!("{path}.resources[{i}]");
            let Some(replicas) = shared_gpu_replicas(&path, resource, notes) else {
                continue;
            };
            if let Some((first, n)) = &chosen {
                if *n != replicas {
                    notes.not_carried(
                        format!("{path}.replicas"),
                        format!("{replicas} differs from the {n} already taken from {first}; one node group has one number of shares"),
                    );
                }
                continue;
            }
            take_replicas(strategy, &path, replicas, values, notes);
            chosen = Some((path, replicas));
        }
    }
}

/// The top-level sections with no Tessera counterpart (`resources`, `imex`).
fn note_unsupported_sections(config: &Value, notes: &mut Notes) {
    if config.get("resources").is_some() {
        notes.not_carried(
            "resources",
            "custom resource names by device pattern have no Tessera counterpart; select devices with CEL in a DeviceClass instead (`tessera schema` lists the attributes)".to_owned(),
        );
    }
    if config.get("imex").is_some() {
        notes.not_carried("imex", "Tessera does not manage IMEX channels".to_owned());
    }
}

/// A sharing strategy's own options (`renameByDefault`, `failRequestsGreaterThanOne`) at `path`.
fn migrate_strategy_options(
    path: &str,
    replicated: &Value,
    values: &mut Mapping,
    notes: &mut Notes,
) {
    if replicated.get("renameByDefault").and_then(Value::as_bool) == Some(true) {
        set(
            values,
            &["extendedResources", "sharedGpu"],
            Value::from("nvidia.com/gpu.shared"),
        );
        notes.change(
            format!("{path}.renameByDefault"),
            "true → extendedResources.sharedGpu: nvidia.com/gpu.shared (class shared.gpu.tessera.dev: pods asking `nvidia.com/gpu.shared` get a share, as before)".to_owned(),
        );
    } else {
        notes.not_carried(
            format!("{path}.renameByDefault"),
            "shared replicas were named `nvidia.com/gpu`; on Tessera that name means a whole GPU (class gpu.tessera.dev), so pods that should share must ask `nvidia.com/gpu.shared` (class shared.gpu.tessera.dev) or use a claim".to_owned(),
        );
    }
    if replicated
        .get("failRequestsGreaterThanOne")
        .and_then(Value::as_bool)
        == Some(true)
    {
        notes.not_carried(
            format!("{path}.failRequestsGreaterThanOne"),
            "a claim may consume several shares on Tessera; nothing refuses requests for more than one".to_owned(),
        );
    }
}

/// The replica count of one `resources[]` entry at `path` when it can become Tessera's
/// consumable shares: an integer in range for `nvidia.com/gpu`. Everything else is noted.
fn shared_gpu_replicas(path: &str, resource: &Value, notes: &mut Notes) -> Option<i64> {
    let name = resource
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(replicas) = resource.get("replicas").and_then(Value::as_i64) else {
        notes.not_carried(path, "no integer `replicas`; skipped".to_owned());
        return None;
    };
    if resource
        .get("devices")
        .is_some_and(|d| d.as_str() != Some("all"))
    {
        notes.not_carried(
            format!("{path}.devices"),
            "sharing only some GPUs of a node: Tessera shares every device of a node group; put those nodes in their own `kubeletPlugin.nodeGroups[]` entry with `sharing.consumableShares`".to_owned(),
        );
    }
    if resource.get("rename").is_some() {
        notes.not_carried(
            format!("{path}.rename"),
            "renamed shared resources: set the name in the chart's `extendedResources` values instead".to_owned(),
        );
    }
    if name != GPU_RESOURCE {
        notes.not_carried(
            path,
            format!(
                "`{name}` replicas: Tessera's consumable shares apply to every device of a node (GPUs and MIG devices alike), taken from the `{GPU_RESOURCE}` entry"
            ),
        );
        return None;
    }
    if !(1..=MAX_SHARES).contains(&replicas) {
        notes.not_carried(
            format!("{path}.replicas"),
            format!(
                "{replicas} is outside the 1–{MAX_SHARES} shares the chart takes; use `consumableShares: memory` and memory requests instead"
            ),
        );
        return None;
    }
    Some(replicas)
}

/// Sets the consumable shares from `replicas` (of `strategy`, at `path`).
fn take_replicas(
    strategy: &str,
    path: &str,
    replicas: i64,
    values: &mut Mapping,
    notes: &mut Notes,
) {
    set(
        values,
        &["kubeletPlugin", "sharing", "consumableShares"],
        Value::from(replicas),
    );
    notes.change(
        format!("{path}.replicas"),
        format!("{replicas} → kubeletPlugin.sharing.consumableShares: {replicas} (each claim consumes one of {replicas} equal shares of a GPU)"),
    );
    if strategy == "mps" {
        notes.change(
            format!("{path}.replicas"),
            "MPS: give the claims (or a DeviceClass) an opaque config `{apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {strategy: MPS}}`; prepare then limits each claim to its shares' thread percentage and memory"
                .to_owned(),
        );
    }
}

fn migrate_flags(flags: &Value, values: &mut Mapping, notes: &mut Notes) {
    let Some(map) = flags.as_mapping() else {
        return;
    };
    for (key, value) in map {
        let key = key.as_str().unwrap_or_default();
        let path = format!("flags.{key}");
        match (key, value) {
            (_, Value::Null) => {}
            ("migStrategy", Value::String(s)) => match s.as_str() {
                "none" => notes.change(
                    path,
                    "none: Tessera publishes the MIG devices a GPU has (and DeviceClass mig.gpu.tessera.dev selects them); nothing to set".to_owned(),
                ),
                "mixed" => {
                    set(values, &["extendedResources", "migPrefix"], Value::from("nvidia.com/mig-"));
                    notes.change(path, "mixed → extendedResources.migPrefix: nvidia.com/mig- (pods asking `nvidia.com/mig-1g.10gb: 1` keep working)".to_owned());
                }
                "single" => notes.not_carried(
                    path,
                    "single: the device plugin names MIG devices `nvidia.com/gpu`; Tessera names them per profile (`nvidia.com/mig-<profile>`, the mixed strategy), so pods on MIG nodes must ask for `nvidia.com/mig-<profile>`".to_owned(),
                ),
                other => notes.not_carried(path, format!("unknown MIG strategy `{other}`")),
            },
            ("nvidiaDriverRoot", Value::String(root)) => {
                set(values, &["kubeletPlugin", "driverRoot"], Value::from(root.as_str()));
                notes.change(path, format!("{root} → kubeletPlugin.driverRoot"));
            }
            ("nvidiaDevRoot", Value::String(root)) => {
                set(values, &["kubeletPlugin", "devRoot"], Value::from(root.as_str()));
                notes.change(path, format!("{root} → kubeletPlugin.devRoot"));
            }
            ("plugin", _) => notes.not_carried(
                path,
                "device-passing options have no counterpart: Tessera always hands devices to containers through CDI".to_owned(),
            ),
            ("gfd", _) => notes.not_carried(
                path,
                "GPU feature discovery: Tessera publishes the GPUs' facts as ResourceSlice attributes instead of node labels".to_owned(),
            ),
            _ => notes.not_carried(path, "has no Tessera counterpart".to_owned()),
        }
    }
}
