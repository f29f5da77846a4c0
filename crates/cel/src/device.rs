//! The `device` variable: built once per device and shared by every selector evaluated on it.

use std::collections::BTreeMap;

use cel::common::types::{CelBool, CelInt, CelList, CelString};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use crate::error::EvalError;
use crate::path;
use crate::quantity::Quantity;
use crate::references::DeviceMap;
use crate::values::{DomainMap, IdMap};
use crate::version::Version;

/// The one value of an attribute, as `resource.k8s.io/v1` `DeviceAttribute` carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    Int(i64),
    Bool(bool),
    String(String),
    /// A semver 2.0.0 string; CEL sees a semver value.
    Version(String),
    Ints(Vec<i64>),
    Bools(Vec<bool>),
    Strings(Vec<String>),
    Versions(Vec<String>),
}

impl AttributeValue {
    /// The value an API attribute carries, or `None` if it sets none of its fields.
    pub fn from_api(attribute: &DeviceAttribute) -> Option<AttributeValue> {
        let a = attribute;
        a.int
            .map(AttributeValue::Int)
            .or_else(|| a.bool.map(AttributeValue::Bool))
            .or_else(|| a.string.clone().map(AttributeValue::String))
            .or_else(|| a.version.clone().map(AttributeValue::Version))
            .or_else(|| a.ints.clone().map(AttributeValue::Ints))
            .or_else(|| a.bools.clone().map(AttributeValue::Bools))
            .or_else(|| a.strings.clone().map(AttributeValue::Strings))
            .or_else(|| a.versions.clone().map(AttributeValue::Versions))
    }

    fn to_val(&self) -> Result<Box<dyn Val>, String> {
        fn list<T>(items: &[T], f: impl Fn(&T) -> Result<Box<dyn Val>, String>) -> ValResult {
            let items: Result<Vec<_>, _> = items.iter().map(f).collect();
            Ok(Box::new(CelList::from(items?)))
        }
        type ValResult = Result<Box<dyn Val>, String>;
        let int = |i: &i64| -> ValResult { Ok(Box::new(CelInt::from(*i))) };
        let boolean = |b: &bool| -> ValResult { Ok(Box::new(CelBool::from(*b))) };
        let string = |s: &String| -> ValResult { Ok(Box::new(CelString::from(s.clone()))) };
        let version = |v: &String| -> ValResult {
            Version::parse(v)
                .map(|v| Box::new(v) as Box<dyn Val>)
                .map_err(|e| format!("parse semantic version: {e}"))
        };
        match self {
            AttributeValue::Int(i) => int(i),
            AttributeValue::Bool(b) => boolean(b),
            AttributeValue::String(s) => string(s),
            AttributeValue::Version(v) => version(v),
            AttributeValue::Ints(items) => list(items, int),
            AttributeValue::Bools(items) => list(items, boolean),
            AttributeValue::Strings(items) => list(items, string),
            AttributeValue::Versions(items) => list(items, version),
        }
    }
}

/// The `device` variable for one device, built once and reused across every selector evaluated
/// on it. `Send + Sync`: build it once, evaluate from any thread.
#[derive(Debug)]
pub struct DeviceContext {
    device: IdMap,
    /// `device.attributes` and `device.capacity` again, for the direct lookups compilation
    /// rewrites constant paths into (see `path`).
    attributes: DomainMap,
    capacity: DomainMap,
    /// A value CEL cannot represent. Upstream fails every selector on such a device; so do we.
    invalid: Option<EvalError>,
}

impl DeviceContext {
    /// The `device` of `device`, published by `driver` (the domain of its unqualified names).
    pub fn new(driver: &str, device: &Device) -> Self {
        let mut invalid = None;
        let attributes = device.attributes.iter().flatten().filter_map(|(name, a)| {
            let value = AttributeValue::from_api(a);
            if value.is_none() {
                invalid.get_or_insert_with(|| EvalError::InvalidDevice {
                    name: format!("attribute {name}"),
                    problem: "unsupported attribute value: none of its fields is set".to_owned(),
                });
            }
            value.map(|v| (name.clone(), v))
        });
        let attributes: Vec<_> = attributes.collect();
        let capacity = device
            .capacity
            .iter()
            .flatten()
            .map(|(name, c)| (name.clone(), c.value.0.clone()));
        let mut context = Self::from_parts(
            driver,
            device.allow_multiple_allocations.unwrap_or(false),
            attributes,
            capacity,
        );
        if context.invalid.is_none() {
            context.invalid = invalid;
        }
        context
    }

    /// A device from plain values: attribute and capacity names as published (qualified or
    /// not), capacity values as Kubernetes quantity strings.
    pub fn from_parts(
        driver: &str,
        allow_multiple_allocations: bool,
        attributes: impl IntoIterator<Item = (String, AttributeValue)>,
        capacity: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let mut invalid = None;
        let mut attribute_domains = Domains::default();
        for (name, value) in attributes {
            match value.to_val() {
                Ok(value) => attribute_domains.insert(driver, &name, value),
                Err(problem) => {
                    invalid.get_or_insert(EvalError::InvalidDevice {
                        name: format!("attribute {name}"),
                        problem,
                    });
                }
            }
        }
        let mut capacity_domains = Domains::default();
        for (name, quantity) in capacity {
            match Quantity::parse(&quantity) {
                Ok(q) => capacity_domains.insert(driver, &name, Box::new(q)),
                Err(e) => {
                    invalid.get_or_insert(EvalError::InvalidDevice {
                        name: format!("capacity {name}"),
                        problem: format!("{quantity:?}: {e}"),
                    });
                }
            }
        }
        let attributes = attribute_domains.into_map();
        let capacity = capacity_domains.into_map();
        let device = IdMap::new(vec![
            (
                "driver".to_owned(),
                Box::new(CelString::from(driver.to_owned())) as Box<dyn Val>,
            ),
            (
                "allowMultipleAllocations".to_owned(),
                Box::new(CelBool::from(allow_multiple_allocations)),
            ),
            ("attributes".to_owned(), Box::new(attributes.clone())),
            ("capacity".to_owned(), Box::new(capacity.clone())),
        ]);
        DeviceContext {
            device,
            attributes,
            capacity,
            invalid,
        }
    }

    pub(crate) fn invalid(&self) -> Option<&EvalError> {
        self.invalid.as_ref()
    }
}

impl VariableResolver for DeviceContext {
    /// `device` and, so that constant paths skip the interpreter's field-by-field walk, the names
    /// `device.<field>` and the rewritten lookups of `path` (`@attributes:<domain>[.<id>]`).
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        if let Some(field) = variable.strip_prefix("device") {
            return match field.strip_prefix('.') {
                None if field.is_empty() => Some(CowVal::Borrowed(&self.device)),
                Some(field) => self
                    .device
                    .find(field)
                    .map(|v| CowVal::Borrowed(v.as_ref())),
                None => None,
            };
        }
        let (map, lookup) = path::parse(variable)?;
        let domains = match map {
            DeviceMap::Attributes => &self.attributes,
            DeviceMap::Capacity => &self.capacity,
        };
        let domain = domains.domain_by(|d| path::is_encoded(d, lookup.encoded_domain));
        match lookup.id {
            None => Some(CowVal::Borrowed(domain)),
            Some(id) => domain.find(id).map(|v| CowVal::Borrowed(v.as_ref())),
        }
    }
}

/// Values grouped by the domain of their qualified name.
#[derive(Default)]
struct Domains(BTreeMap<String, BTreeMap<String, Box<dyn Val>>>);

impl Domains {
    fn insert(&mut self, driver: &str, name: &str, value: Box<dyn Val>) {
        let (domain, id) = name.split_once('/').unwrap_or((driver, name));
        self.0
            .entry(domain.to_owned())
            .or_default()
            .insert(id.to_owned(), value);
    }

    fn into_map(self) -> DomainMap {
        DomainMap::new(
            self.0
                .into_iter()
                .map(|(domain, ids)| (domain, IdMap::new(ids.into_iter().collect())))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SelectorCompiler;
    use k8s_openapi::api::resource::v1::DeviceCapacity;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_types_are_send_and_sync() {
        assert_send_sync::<DeviceContext>();
        assert_send_sync::<crate::Selector>();
        assert_send_sync::<SelectorCompiler>();
    }

    fn api_device() -> Device {
        let attribute = |f: fn(&mut DeviceAttribute)| {
            let mut a = DeviceAttribute::default();
            f(&mut a);
            a
        };
        Device {
            name: "gpu-0".to_owned(),
            attributes: Some(BTreeMap::from([
                (
                    "type".to_owned(),
                    attribute(|a| a.string = Some("gpu".to_owned())),
                ),
                (
                    "driverVersion".to_owned(),
                    attribute(|a| a.version = Some("550.54.15".to_owned())),
                ),
                (
                    "resource.kubernetes.io/pcieRoot".to_owned(),
                    attribute(|a| a.string = Some("pci0000:00".to_owned())),
                ),
                ("links".to_owned(), attribute(|a| a.ints = Some(vec![1, 2]))),
            ])),
            capacity: Some(BTreeMap::from([(
                "memory".to_owned(),
                DeviceCapacity {
                    value: ApiQuantity("80Gi".to_owned()),
                    ..Default::default()
                },
            )])),
            allow_multiple_allocations: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn builds_the_device_variable_from_the_api_type() {
        let device = DeviceContext::new("gpu.tessera.dev", &api_device());
        let compiler = SelectorCompiler::new();
        for expression in [
            r#"device.driver == "gpu.tessera.dev""#,
            r#"device.attributes["gpu.tessera.dev"].type == "gpu""#,
            r#"device.attributes["gpu.tessera.dev"].driverVersion.isGreaterThan(semver("535.0.0"))"#,
            r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
            r#"device.attributes["gpu.tessera.dev"].links.includes(2)"#,
            r#"device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("80Gi")) == 0"#,
            "device.allowMultipleAllocations",
        ] {
            let selector = compiler.compile(expression).unwrap();
            assert_eq!(selector.evaluate(&device), Ok(true), "{expression}");
        }
    }

    #[test]
    fn a_value_cel_cannot_represent_fails_every_selector() {
        let mut device = api_device();
        if let Some(attributes) = device.attributes.as_mut() {
            attributes.insert(
                "cudaVersion".to_owned(),
                DeviceAttribute {
                    version: Some("12.4".to_owned()),
                    ..Default::default()
                },
            );
        }
        let device = DeviceContext::new("gpu.tessera.dev", &device);
        let selector = SelectorCompiler::new().compile("true").unwrap();
        let error = selector.evaluate(&device).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("attribute cudaVersion: parse semantic version"),
            "{error}"
        );

        let empty = Device {
            name: "x".to_owned(),
            attributes: Some(BTreeMap::from([(
                "none".to_owned(),
                DeviceAttribute::default(),
            )])),
            ..Default::default()
        };
        let error = selector
            .evaluate(&DeviceContext::new("d", &empty))
            .unwrap_err();
        assert!(
            error.to_string().contains("none of its fields is set"),
            "{error}"
        );
    }
}
