//! Checks against Tessera's device schema: attribute and capacity names, and what selectors
//! return on sample devices rendered from the schema.

use tessera_api::DRIVER_NAME;
use tessera_api::names::device_type;
use tessera_api::schema::{self, AttributeKind, Carriers};
use tessera_cel::{AttributeValue, DeviceContext, DeviceMap, EvalError, NameReference, Selector};

/// Domains that look like a typo of Tessera's (`gpu.tesera.dev`) score at least this.
const DOMAIN_TYPO_SIMILARITY: f64 = 0.9;

/// The problem with a constant name lookup in a selector, if it names something Tessera does not
/// publish in a domain whose names Tessera's schema describes.
pub fn reference_problem(reference: &NameReference) -> Option<String> {
    let (domain, name) = (reference.domain.as_str(), reference.name.as_str());
    let (map, kind) = match reference.map {
        DeviceMap::Attributes => ("attributes", "attribute"),
        DeviceMap::Capacity => ("capacity", "capacity"),
    };
    let lookup = format!("device.{map}[\"{domain}\"].{name}");
    if domain == tessera_api::nvidia::NVIDIA_DRIVER_NAME {
        return Some(format!(
            "`{lookup}`: `{domain}` is NVIDIA's driver's domain, which no Tessera device has; Tessera's is `{DRIVER_NAME}` (`tessera migrate` rewrites NVIDIA manifests)"
        ));
    }
    if !schema::is_schema_domain(domain) {
        let similarity = strsim::jaro_winkler(domain, DRIVER_NAME);
        return (similarity >= DOMAIN_TYPO_SIMILARITY).then(|| {
            format!(
                "`{lookup}`: no device has the domain `{domain}` (did you mean `{DRIVER_NAME}`?)"
            )
        });
    }
    let (known, other_map_has_it, closest) = match reference.map {
        DeviceMap::Attributes => (
            schema::attribute(domain, name).is_some(),
            schema::capacity(domain, name).is_some(),
            schema::closest_attribute(domain, name),
        ),
        DeviceMap::Capacity => (
            schema::capacity(domain, name).is_some(),
            schema::attribute(domain, name).is_some(),
            schema::closest_capacity(domain, name),
        ),
    };
    if known {
        return None;
    }
    let qualified = qualified(domain, name);
    Some(if other_map_has_it {
        let other = match reference.map {
            DeviceMap::Attributes => "capacity",
            DeviceMap::Capacity => "attributes",
        };
        format!(
            "`{lookup}`: `{qualified}` is not {}; read it from `device.{other}[\"{domain}\"]`",
            article(kind)
        )
    } else {
        let hint = closest
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        format!("`{lookup}`: Tessera publishes no {kind} `{qualified}`{hint}")
    })
}

fn article(kind: &str) -> String {
    match kind {
        "attribute" => "an attribute".to_owned(),
        other => format!("a {other}"),
    }
}

fn qualified(domain: &str, name: &str) -> String {
    if domain == DRIVER_NAME {
        name.to_owned()
    } else {
        format!("{domain}/{name}")
    }
}

/// The problem with a constraint's fully qualified attribute name, if any.
pub fn qualified_attribute_problem(name: &str) -> Option<String> {
    let Some((domain, id)) = name.split_once('/') else {
        return Some(format!(
            "`{name}` must be fully qualified, as `{DRIVER_NAME}/{name}`"
        ));
    };
    if !schema::is_schema_domain(domain) || schema::attribute(domain, id).is_some() {
        return None;
    }
    let hint = schema::closest_attribute(domain, id)
        .map(|c| format!(" (did you mean `{domain}/{c}`?)"))
        .unwrap_or_default();
    Some(format!("Tessera publishes no attribute `{name}`{hint}"))
}

/// A whole GPU and a MIG device with every attribute and capacity the schema gives them.
pub struct SampleDevices {
    devices: Vec<(&'static str, DeviceContext)>,
}

impl SampleDevices {
    pub fn new() -> SampleDevices {
        let devices = [
            (device_type::GPU, Carriers::Gpu),
            (device_type::MIG, Carriers::Mig),
        ]
        .into_iter()
        .map(|(type_name, carriers)| (type_name, sample(type_name, carriers)))
        .collect();
        SampleDevices { devices }
    }

    /// A problem with what `selector` returns on the samples: not a bool, or over budget.
    pub fn result_problem(&self, selector: &Selector) -> Option<String> {
        self.devices.iter().find_map(|(type_name, device)| match selector.evaluate(device) {
            Err(EvalError::NotBool { found }) => Some(format!(
                "evaluates to {found}, not bool, on a sample {type_name} device; compare the value with something"
            )),
            Err(e @ EvalError::CostLimitExceeded { .. }) => Some(format!("on a sample {type_name} device: {e}")),
            _ => None,
        })
    }
}

fn carried(carriers: Carriers, device: Carriers) -> bool {
    carriers == Carriers::All || carriers == device
}

fn sample(type_name: &str, device: Carriers) -> DeviceContext {
    let attributes = schema::ATTRIBUTES
        .iter()
        .filter(|a| carried(a.carriers, device))
        .map(|a| {
            let value = match a.kind {
                AttributeKind::String if a.name == tessera_api::names::attr::TYPE => {
                    AttributeValue::String(type_name.to_owned())
                }
                AttributeKind::String => AttributeValue::String("sample".to_owned()),
                AttributeKind::Int => AttributeValue::Int(0),
                AttributeKind::Bool => AttributeValue::Bool(false),
                AttributeKind::Version => AttributeValue::Version("1.0.0".to_owned()),
            };
            (a.name.to_owned(), value)
        });
    let capacity = schema::CAPACITIES
        .iter()
        .filter(|c| carried(c.carriers, device))
        .map(|c| (c.name.to_owned(), "1".to_owned()));
    DeviceContext::from_parts(DRIVER_NAME, false, attributes, capacity)
}
