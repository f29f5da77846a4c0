//! NVIDIA DRA manifests (driver `gpu.nvidia.com`) rewritten into Tessera's: DeviceClass names,
//! CEL selectors (driver name, attribute domain and names, through the parser:
//! [`tessera_cel::rewrite_domain`]), constraint and capacity names, opaque configs
//! (`resource.nvidia.com/v1beta1` read as what they mean, [`tessera_api::nvidia`]) and the
//! beta/alpha structured API versions lifted to `resource.k8s.io/v1`. Pure: objects in, objects
//! and notes out.

use serde_yaml::{Mapping, Value};
use tessera_api::names::{CONFIG_API_VERSION, GPU_DEVICE_CLASS, MIG_DEVICE_CLASS};
use tessera_api::nvidia::{NVIDIA_CONFIG_API_VERSION, NVIDIA_DRIVER_NAME, NVIDIA_MIG_DEVICE_CLASS};
use tessera_api::{DRIVER_NAME, schema};
use tessera_cel::{DeviceMap, NameFate};

use super::notes::Notes;

const V1: &str = "resource.k8s.io/v1";
/// Structured-parameters versions whose requests carry the device fields directly (no `exactly`).
const FLAT_REQUEST_VERSIONS: &[&str] = &["resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta1"];
/// Request fields that move under `exactly` when lifting a flat request to v1.
const EXACT_FIELDS: &[&str] = &[
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
];

/// One object after migration: `None` when it is not carried over (the notes say why).
pub struct Migrated {
    pub object: Option<Value>,
}

fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// Whether a DeviceClass name is one of NVIDIA's own for what Tessera does not offer (VFIO
/// passthrough, ComputeDomains). Other `*.nvidia.com` names are classes users wrote for NVIDIA's
/// devices (NVIDIA's extended-resources example names one `mig-1g-12gb.gpu.nvidia.com`), which
/// the migration carries.
fn nvidia_only_class(name: &str) -> bool {
    name.ends_with(".nvidia.com") && (name.contains("vfio") || name.starts_with("compute-domain"))
}

/// The Tessera DeviceClass for an NVIDIA one, if there is one.
fn class_for(name: &str) -> Result<Option<&'static str>, String> {
    match name {
        NVIDIA_DRIVER_NAME => Ok(Some(GPU_DEVICE_CLASS)),
        NVIDIA_MIG_DEVICE_CLASS => Ok(Some(MIG_DEVICE_CLASS)),
        n if nvidia_only_class(n) => Err(format!(
            "DeviceClass `{n}` is NVIDIA's (VFIO passthrough or ComputeDomains), which Tessera does not offer; the request keeps it and will not be allocated by Tessera"
        )),
        _ => Ok(None),
    }
}

/// What becomes of an NVIDIA attribute or capacity name.
pub fn name_fate(map: DeviceMap, name: &str) -> NameFate {
    let known = match map {
        DeviceMap::Attributes => schema::attribute(DRIVER_NAME, name).is_some(),
        DeviceMap::Capacity => schema::capacity(DRIVER_NAME, name).is_some(),
    };
    if known {
        return NameFate::Same;
    }
    let why = match name {
        n if n.starts_with("memorySlice") => {
            "Tessera models MIG memory slices as counters, not capacities; select MIG devices by `profile` instead".to_owned()
        }
        "addressingMode" | "gpuModuleID" | "iommuFDEnabled" | "deviceID" | "vendorID"
        | "addressableMemory" => format!("Tessera does not publish `{name}`"),
        n if n.starts_with("partition") => {
            "Tessera does not publish Fabric Manager partitions; use `nvlinkIsland` or `fabricClique`".to_owned()
        }
        _ => {
            let closest = match map {
                DeviceMap::Attributes => schema::closest_attribute(DRIVER_NAME, name),
                DeviceMap::Capacity => schema::closest_capacity(DRIVER_NAME, name),
            };
            match closest {
                Some(c) => format!("Tessera publishes no `{name}` (closest: `{c}`)"),
                None => format!("Tessera publishes no `{name}` (`tessera schema` lists what it does)"),
            }
        }
    };
    NameFate::Missing(format!(
        "{why}; the selector still reads it and will fail on Tessera's devices"
    ))
}

/// Migrates one object; objects that are not DRA objects pass through unchanged.
pub fn migrate_object(mut object: Value, notes: &mut Notes) -> Migrated {
    let api_version = str_at(&object, "apiVersion").unwrap_or_default().to_owned();
    let kind = str_at(&object, "kind").unwrap_or_default().to_owned();
    let (group, _) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    if group != "resource.k8s.io" {
        let kept = !drops_nvidia_object(group, &api_version, &kind, notes);
        return Migrated {
            object: kept.then_some(object),
        };
    }
    if api_version == "resource.k8s.io/v1alpha2" {
        notes.not_carried(
            "",
            format!(
                "{kind} uses classic DRA (resource.k8s.io/v1alpha2, removed in Kubernetes 1.31); dropped: rewrite it as a resource.k8s.io/v1 object"
            ),
        );
        return Migrated { object: None };
    }
    let flat = FLAT_REQUEST_VERSIONS.contains(&api_version.as_str());
    if api_version != V1
        && matches!(
            kind.as_str(),
            "DeviceClass" | "ResourceClaim" | "ResourceClaimTemplate"
        )
    {
        object["apiVersion"] = Value::from(V1);
        notes.change("apiVersion", format!("{api_version} → {V1}"));
    }
    let kept = match kind.as_str() {
        "DeviceClass" => migrate_device_class(&mut object, notes),
        "ResourceClaim" => {
            if let Some(devices) = object.get_mut("spec").and_then(|s| s.get_mut("devices")) {
                claim_devices(devices, "spec.devices", flat, notes);
            }
            true
        }
        "ResourceClaimTemplate" => {
            if let Some(devices) = object
                .get_mut("spec")
                .and_then(|s| s.get_mut("spec"))
                .and_then(|s| s.get_mut("devices"))
            {
                claim_devices(devices, "spec.spec.devices", flat, notes);
            }
            true
        }
        _ => true,
    };
    Migrated {
        object: kept.then_some(object),
    }
}

/// Whether an object outside `resource.k8s.io` is one of NVIDIA's (classic DRA parameters,
/// ComputeDomains) that the migration drops, with the note that says so.
fn drops_nvidia_object(group: &str, api_version: &str, kind: &str, notes: &mut Notes) -> bool {
    if group.ends_with(".nvidia.com") && group != "resource.nvidia.com" || group == "nvidia.com" {
        notes.not_carried(
            "",
            format!(
                "{api_version} {kind} is a parameters object of NVIDIA's classic DRA driver; dropped: write the request as a resource.k8s.io/v1 claim with CEL selectors (`tessera schema` lists the attributes)"
            ),
        );
        return true;
    }
    if group == "resource.nvidia.com" {
        notes.not_carried(
            "",
            format!(
                "{kind} ({api_version}) has no Tessera counterpart (a ComputeDomain becomes a claim of class imex.gpu.tessera.dev; this kind does not); dropped"
            ),
        );
        return true;
    }
    false
}

/// Migrates a DeviceClass in place; false when it is dropped (NVIDIA's own classes, which
/// Tessera's chart replaces).
fn migrate_device_class(object: &mut Value, notes: &mut Notes) -> bool {
    let name = object
        .get("metadata")
        .and_then(|m| str_at(m, "name"))
        .unwrap_or_default()
        .to_owned();
    match class_for(&name) {
        Ok(Some(ours)) => {
            notes.change(
                "",
                format!("NVIDIA's DeviceClass `{name}` dropped: Tessera's chart installs `{ours}`, and requests are pointed there"),
            );
            return false;
        }
        Err(why) => {
            notes.not_carried("", format!("{why}; dropped"));
            return false;
        }
        Ok(None) => {}
    }
    if let Some(spec) = object.get_mut("spec") {
        if name.ends_with(".nvidia.com") {
            notes.change(
                "",
                format!(
                    "DeviceClass `{name}` is a class written for NVIDIA's devices{}: carried with its selectors moved to Tessera's devices; its name is kept so the claims naming it keep working",
                    mig_profile_of(spec)
                        .map(|p| format!(" (MIG profile `{p}`)"))
                        .unwrap_or_default()
                ),
            );
        }
        device_class_spec(spec, notes);
    }
    true
}

/// The MIG profile a class's selectors ask for, when one compares `profile` with a literal
/// (`device.attributes['gpu.nvidia.com'].profile == '1g.12gb'`).
fn mig_profile_of(spec: &Value) -> Option<String> {
    spec.get("selectors")?
        .as_sequence()?
        .iter()
        .filter_map(|s| s.get("cel")?.get("expression")?.as_str())
        .find_map(|expression| {
            let (_, after) = expression.split_once("].profile")?;
            let after = after.trim_start().strip_prefix("==")?.trim_start();
            let quote = after.chars().next().filter(|c| *c == '\'' || *c == '"')?;
            let rest = &after[1..];
            Some(rest[..rest.find(quote)?].to_owned())
        })
}

fn device_class_spec(spec: &mut Value, notes: &mut Notes) {
    if let Some(selectors) = spec.get_mut("selectors").and_then(Value::as_sequence_mut) {
        for (i, selector) in selectors.iter_mut().enumerate() {
            cel_selector(selector, &format!("spec.selectors[{i}]"), notes);
        }
    }
    configs(spec, "spec.config", notes);
    if let Some(name) = str_at(spec, "extendedResourceName").map(str::to_owned)
        && (name == "nvidia.com/gpu" || name.starts_with("nvidia.com/mig-"))
        && let Some(map) = spec.as_mapping_mut()
    {
        map.remove("extendedResourceName");
        let serving = match name.strip_prefix("nvidia.com/mig-") {
            Some(profile) => format!("class `mig-{profile}.gpu.tessera.dev`"),
            None => "its own classes".to_owned(),
        };
        notes.change(
            "spec.extendedResourceName",
            format!("`{name}` removed: Tessera's chart serves it from {serving} (value `extendedResources`); two classes with one name would be ambiguous"),
        );
    }
}

fn claim_devices(devices: &mut Value, path: &str, flat: bool, notes: &mut Notes) {
    if let Some(requests) = devices.get_mut("requests").and_then(Value::as_sequence_mut) {
        for (i, request) in requests.iter_mut().enumerate() {
            let path = format!("{path}.requests[{i}]");
            if flat {
                lift_request(request, &path, notes);
            }
            if let Some(exactly) = request.get_mut("exactly") {
                request_body(exactly, &format!("{path}.exactly"), notes);
            }
            if let Some(subs) = request
                .get_mut("firstAvailable")
                .and_then(Value::as_sequence_mut)
            {
                for (j, sub) in subs.iter_mut().enumerate() {
                    request_body(sub, &format!("{path}.firstAvailable[{j}]"), notes);
                }
            }
        }
    }
    if let Some(constraints) = devices
        .get_mut("constraints")
        .and_then(Value::as_sequence_mut)
    {
        for (i, constraint) in constraints.iter_mut().enumerate() {
            for field in ["matchAttribute", "distinctAttribute"] {
                if let Some(slot) = constraint.get_mut(field) {
                    qualified_name(
                        slot,
                        DeviceMap::Attributes,
                        &format!("{path}.constraints[{i}].{field}"),
                        notes,
                    );
                }
            }
        }
    }
    configs(devices, &format!("{path}.config"), notes);
}

/// v1beta1/v1alpha3 requests hold the device fields themselves; v1 puts them under `exactly`.
fn lift_request(request: &mut Value, path: &str, notes: &mut Notes) {
    let Some(map) = request.as_mapping_mut() else {
        return;
    };
    if map.contains_key("exactly") || map.contains_key("firstAvailable") {
        return;
    }
    let mut exactly = Mapping::new();
    for field in EXACT_FIELDS {
        if let Some(value) = map.remove(*field) {
            exactly.insert(Value::from(*field), value);
        }
    }
    if !exactly.is_empty() {
        map.insert(Value::from("exactly"), Value::Mapping(exactly));
        notes.change(
            path,
            "device fields moved under `exactly` (resource.k8s.io/v1)".to_owned(),
        );
    }
}

fn request_body(body: &mut Value, path: &str, notes: &mut Notes) {
    if let Some(class) = str_at(body, "deviceClassName").map(str::to_owned) {
        match class_for(&class) {
            Ok(Some(ours)) => {
                body["deviceClassName"] = Value::from(ours);
                notes.change(
                    format!("{path}.deviceClassName"),
                    format!("{class} → {ours}"),
                );
            }
            Err(why) => notes.not_carried(format!("{path}.deviceClassName"), why),
            Ok(None) => {}
        }
    }
    if let Some(selectors) = body.get_mut("selectors").and_then(Value::as_sequence_mut) {
        for (i, selector) in selectors.iter_mut().enumerate() {
            cel_selector(selector, &format!("{path}.selectors[{i}]"), notes);
        }
    }
    if let Some(requests) = body
        .get_mut("capacity")
        .and_then(|c| c.get_mut("requests"))
        .and_then(Value::as_mapping_mut)
    {
        let renamed: Vec<(Value, Value)> = std::mem::take(requests)
            .into_iter()
            .map(|(key, value)| {
                let mut key = key;
                qualified_name(
                    &mut key,
                    DeviceMap::Capacity,
                    &format!("{path}.capacity.requests"),
                    notes,
                );
                (key, value)
            })
            .collect();
        requests.extend(renamed);
    }
}

/// A qualified attribute or capacity name (`gpu.nvidia.com/productName`).
fn qualified_name(slot: &mut Value, map: DeviceMap, path: &str, notes: &mut Notes) {
    let Some(name) = slot.as_str().map(str::to_owned) else {
        return;
    };
    let Some(id) = name.strip_prefix(&format!("{NVIDIA_DRIVER_NAME}/")) else {
        return;
    };
    let new_id = match name_fate(map, id) {
        NameFate::Same => id.to_owned(),
        NameFate::Renamed(new) => new,
        NameFate::Missing(why) => {
            notes.not_carried(path, format!("`{name}`: {why}"));
            return;
        }
    };
    let new = format!("{DRIVER_NAME}/{new_id}");
    notes.change(path, format!("{name} → {new}"));
    *slot = Value::from(new);
}

fn cel_selector(selector: &mut Value, path: &str, notes: &mut Notes) {
    let Some(slot) = selector
        .get_mut("cel")
        .and_then(|c| c.get_mut("expression"))
    else {
        return;
    };
    let Some(expression) = slot.as_str().map(str::to_owned) else {
        return;
    };
    let path = format!("{path}.cel.expression");
    match tessera_cel::rewrite_domain(&expression, NVIDIA_DRIVER_NAME, DRIVER_NAME, &name_fate) {
        Ok(rewritten) => {
            for change in rewritten.changes {
                notes.change(&path, change);
            }
            for problem in rewritten.not_carried {
                notes.not_carried(&path, problem);
            }
            *slot = Value::from(rewritten.expression);
        }
        Err(e) => notes.not_carried(&path, format!("does not parse, left as written: {e}")),
    }
}

/// `config[]` of a class or claim: NVIDIA's driver name and configs become ours.
fn configs(parent: &mut Value, path: &str, notes: &mut Notes) {
    let Some(entries) = parent.get_mut("config").and_then(Value::as_sequence_mut) else {
        return;
    };
    let mut kept = Vec::with_capacity(entries.len());
    for (i, mut entry) in std::mem::take(entries).into_iter().enumerate() {
        let path = format!("{path}[{i}].opaque");
        match entry.get_mut("opaque") {
            Some(opaque) => {
                if opaque_config(opaque, &path, notes) {
                    kept.push(entry);
                }
            }
            None => kept.push(entry),
        }
    }
    *entries = kept;
}

/// Rewrites one opaque config; `false` when it is dropped.
fn opaque_config(opaque: &mut Value, path: &str, notes: &mut Notes) -> bool {
    let driver = str_at(opaque, "driver").unwrap_or_default().to_owned();
    if driver != NVIDIA_DRIVER_NAME && driver != DRIVER_NAME {
        return true;
    }
    let Some(parameters) = opaque.get("parameters") else {
        return true;
    };
    if str_at(parameters, "apiVersion") != Some(NVIDIA_CONFIG_API_VERSION) {
        if driver == NVIDIA_DRIVER_NAME {
            notes.not_carried(
                path,
                format!(
                    "a {NVIDIA_DRIVER_NAME} config that is not {NVIDIA_CONFIG_API_VERSION}; dropped"
                ),
            );
            return false;
        }
        return true;
    }
    let json = match serde_json::to_value(parameters) {
        Ok(json) => json,
        Err(e) => {
            notes.not_carried(path, format!("parameters are not JSON-like ({e}); dropped"));
            return false;
        }
    };
    let accepted = match tessera_api::nvidia::decode_accepting_nvidia(&json) {
        Ok(accepted) => accepted,
        Err(e) => {
            notes.not_carried(
                format!("{path}.parameters"),
                format!("{e}; dropped, so the claim's devices are not shared the way NVIDIA's driver would share them"),
            );
            return false;
        }
    };
    if driver == NVIDIA_DRIVER_NAME {
        opaque["driver"] = Value::from(DRIVER_NAME);
        notes.change(
            format!("{path}.driver"),
            format!("{NVIDIA_DRIVER_NAME} → {DRIVER_NAME}"),
        );
    }
    let Some(translation) = accepted.translation else {
        // Not NVIDIA's after all (the apiVersion was checked above): keep it as written.
        return true;
    };
    if !translation.per_device_pinned_memory_limit.is_empty() {
        notes.change(
            format!("{path}.parameters"),
            format!(
                "kept as {NVIDIA_CONFIG_API_VERSION}: its defaultPerDevicePinnedMemoryLimit keys (device index or UUID) are resolved by the node plugin when the devices are known"
            ),
        );
        return true;
    }
    let mut ours = Mapping::new();
    ours.insert(Value::from("apiVersion"), Value::from(CONFIG_API_VERSION));
    match serde_yaml::to_value(&accepted.config) {
        Ok(Value::Mapping(body)) => ours.extend(body),
        other => {
            notes.not_carried(
                path,
                format!("cannot write the config ({other:?}); kept as written"),
            );
            return true;
        }
    }
    for note in translation.notes {
        notes.change(format!("{path}.parameters"), note);
    }
    opaque["parameters"] = Value::Mapping(ours);
    true
}
