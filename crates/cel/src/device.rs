//! The `device` variable: built once per device and shared by every selector evaluated on it.

use std::collections::BTreeMap;

use cel::common::types::{CelBool, CelInt, CelList, CelString};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use crate::error::EvalError;
use crate::path;
use crate::quantity::QuantityValue;
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
        let attributes = device
            .attributes
            .iter()
            .flatten()
            .filter_map(|(name, a)| AttributeValue::from_api(a).map(|v| (name.clone(), v)));
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
        // The same check a [`DeviceView`] makes, so both fail a device alike.
        context.invalid = invalid_device(device);
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
            match QuantityValue::parse(&quantity) {
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

/// Why upstream would fail every selector on `device` (it converts every value before evaluating
/// anything), checked without building a value: the first attribute (in name order) whose value
/// CEL cannot represent, else the first capacity whose quantity does not parse, else the first
/// attribute that sets no value.
fn invalid_device(device: &Device) -> Option<EvalError> {
    let attributes = || device.attributes.iter().flatten();
    let bad_value = attributes().find_map(|(name, a)| {
        let problem = match AttributeRef::of(a)? {
            AttributeRef::Version(v) => version_problem(v),
            AttributeRef::Versions(vs) => vs.iter().find_map(|v| version_problem(v)),
            _ => None,
        }?;
        Some(EvalError::InvalidDevice {
            name: format!("attribute {name}"),
            problem,
        })
    });
    let bad_quantity = || {
        device.capacity.iter().flatten().find_map(|(name, c)| {
            QuantityValue::parse(&c.value.0)
                .err()
                .map(|e| EvalError::InvalidDevice {
                    name: format!("capacity {name}"),
                    problem: format!("{:?}: {e}", c.value.0),
                })
        })
    };
    let no_value = || {
        attributes()
            .find(|(_, a)| AttributeRef::of(a).is_none())
            .map(|(name, _)| EvalError::InvalidDevice {
                name: format!("attribute {name}"),
                problem: "unsupported attribute value: none of its fields is set".to_owned(),
            })
    };
    bad_value.or_else(bad_quantity).or_else(no_value)
}

fn version_problem(v: &str) -> Option<String> {
    Version::parse(v)
        .err()
        .map(|e| format!("parse semantic version: {e}"))
}

/// The value an API attribute carries, borrowed (the field [`AttributeValue::from_api`] picks).
enum AttributeRef<'a> {
    Scalar(&'a DeviceAttribute),
    String(&'a str),
    Version(&'a str),
    Versions(&'a [String]),
}

impl<'a> AttributeRef<'a> {
    fn of(a: &'a DeviceAttribute) -> Option<AttributeRef<'a>> {
        if a.int.is_some() || a.bool.is_some() {
            return Some(AttributeRef::Scalar(a));
        }
        if let Some(s) = &a.string {
            return Some(AttributeRef::String(s));
        }
        if let Some(v) = &a.version {
            return Some(AttributeRef::Version(v));
        }
        if a.ints.is_some() || a.bools.is_some() || a.strings.is_some() {
            return Some(AttributeRef::Scalar(a));
        }
        a.versions.as_deref().map(AttributeRef::Versions)
    }

    /// The CEL value; strings are borrowed, not copied.
    fn to_val(&self) -> Option<Box<dyn Val + 'a>> {
        match self {
            AttributeRef::String(s) => Some(Box::new(CelString::from(*s))),
            AttributeRef::Scalar(a) => AttributeValue::from_api(a)?.to_val().ok(),
            AttributeRef::Version(v) => Version::parse(v).ok().map(|v| Box::new(v) as _),
            AttributeRef::Versions(vs) => AttributeValue::Versions(vs.to_vec()).to_val().ok(),
        }
    }
}

/// The `device` variable read straight from the API object, one looked-up value at a time: for
/// selectors that reach the device only through one-step names
/// ([`crate::Selector::reads_paths_only`]), which is what most class and request selectors do
/// (`device.driver == "…"`, `device.attributes["…"].type == "gpu"`). Building it costs a check of
/// the device's values and no copies, where a [`DeviceContext`] converts every attribute and
/// capacity; evaluating is as fast. A selector that needs the whole maps is evaluated on a
/// [`DeviceContext`] built for the purpose ([`crate::Selector::evaluate_view`] decides).
#[derive(Debug)]
pub struct DeviceView<'d> {
    driver: &'d str,
    device: &'d Device,
    invalid: Option<EvalError>,
}

impl<'d> DeviceView<'d> {
    /// A view of `device`, published by `driver`, checking its values as [`DeviceContext::new`]
    /// does.
    pub fn new(driver: &'d str, device: &'d Device) -> Self {
        Self::checked(driver, device, invalid_device(device))
    }

    /// A view whose check was made before: `invalid` is what [`DeviceView::invalid`] said then
    /// (a caller evaluating one device many times keeps it instead of checking again).
    pub fn checked(driver: &'d str, device: &'d Device, invalid: Option<EvalError>) -> Self {
        DeviceView {
            driver,
            device,
            invalid,
        }
    }

    /// Why every selector fails on this device, if one does.
    pub fn invalid(&self) -> Option<&EvalError> {
        self.invalid.as_ref()
    }

    pub(crate) fn driver(&self) -> &'d str {
        self.driver
    }

    pub(crate) fn device(&self) -> &'d Device {
        self.device
    }

    /// `(domain, id)` of a published name: unqualified names are the driver's.
    fn split<'n>(&self, name: &'n str) -> (&'n str, &'n str)
    where
        'd: 'n,
    {
        name.split_once('/').unwrap_or((self.driver, name))
    }

    /// The attribute `encoded_domain`/`id` names; of two published names for it (`type` and
    /// `<driver>/type`) the later in name order, as the context's maps keep it.
    fn attribute(&self, encoded_domain: &str, id: &str) -> Option<&'d DeviceAttribute> {
        self.device
            .attributes
            .iter()
            .flatten()
            .rev()
            .find(|(name, _)| {
                let (domain, own) = self.split(name);
                own == id && path::is_encoded(domain, encoded_domain)
            })
            .map(|(_, a)| a)
    }

    fn capacity(&self, encoded_domain: &str, id: &str) -> Option<&'d str> {
        self.device
            .capacity
            .iter()
            .flatten()
            .rev()
            .find(|(name, _)| {
                let (domain, own) = self.split(name);
                own == id && path::is_encoded(domain, encoded_domain)
            })
            .map(|(_, c)| c.value.0.as_str())
    }

    /// One domain's map, built on demand (a selector using the map itself, e.g. `"x" in
    /// device.attributes["d"]`).
    fn domain_map(&self, map: DeviceMap, encoded_domain: &str) -> IdMap {
        let mut ids: BTreeMap<&str, Box<dyn Val>> = BTreeMap::new();
        let in_domain = |name: &'d String| {
            let (domain, id) = self.split(name);
            path::is_encoded(domain, encoded_domain).then_some(id)
        };
        match map {
            DeviceMap::Attributes => {
                for (name, a) in self.device.attributes.iter().flatten() {
                    let value = AttributeValue::from_api(a).and_then(|v| v.to_val().ok());
                    if let (Some(id), Some(value)) = (in_domain(name), value) {
                        ids.insert(id, value);
                    }
                }
            }
            DeviceMap::Capacity => {
                for (name, c) in self.device.capacity.iter().flatten() {
                    let value = QuantityValue::parse(&c.value.0).ok();
                    if let (Some(id), Some(value)) = (in_domain(name), value) {
                        ids.insert(id, Box::new(value));
                    }
                }
            }
        }
        IdMap::new(ids.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }
}

impl VariableResolver for DeviceView<'_> {
    /// What [`DeviceContext`] resolves for the one-step names; `None` for the whole maps, which a
    /// selector evaluated on a view never asks for.
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        match variable {
            "device.driver" => return Some(CowVal::owned(CelString::from(self.driver))),
            "device.allowMultipleAllocations" => {
                let multi = self.device.allow_multiple_allocations.unwrap_or(false);
                return Some(CowVal::owned(CelBool::from(multi)));
            }
            _ => {}
        }
        let (map, lookup) = path::parse(variable)?;
        let Some(id) = lookup.id else {
            return Some(CowVal::owned(self.domain_map(map, lookup.encoded_domain)));
        };
        match map {
            DeviceMap::Attributes => self
                .attribute(lookup.encoded_domain, id)
                .and_then(|a| AttributeRef::of(a)?.to_val())
                .map(CowVal::Owned),
            DeviceMap::Capacity => self
                .capacity(lookup.encoded_domain, id)
                .and_then(|q| QuantityValue::parse(q).ok())
                .map(CowVal::owned),
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
    /// The test device with `type` published both qualified and not, and a list of versions.
    fn published_twice() -> Device {
        let mut twice = api_device();
        if let Some(attributes) = twice.attributes.as_mut() {
            attributes.insert(
                "gpu.tessera.dev/type".to_owned(),
                DeviceAttribute {
                    string: Some("qualified".to_owned()),
                    ..Default::default()
                },
            );
            attributes.insert(
                "versions".to_owned(),
                DeviceAttribute {
                    versions: Some(vec!["1.0.0".to_owned(), "2.1.0".to_owned()]),
                    ..Default::default()
                },
            );
        }
        twice
    }

    /// The test device with a version that is not semver and an attribute with no value set.
    fn with_a_bad_version() -> Device {
        let mut bad_version = api_device();
        if let Some(attributes) = bad_version.attributes.as_mut() {
            attributes.insert(
                "cudaVersion".to_owned(),
                DeviceAttribute {
                    version: Some("12.4".to_owned()),
                    ..Default::default()
                },
            );
            attributes.insert("zzz".to_owned(), DeviceAttribute::default());
        }
        bad_version
    }

    /// The test device with a capacity that is not a quantity.
    fn with_a_bad_quantity() -> Device {
        let mut bad_quantity = api_device();
        if let Some(capacity) = bad_quantity.capacity.as_mut() {
            capacity.insert(
                "broken".to_owned(),
                DeviceCapacity {
                    value: ApiQuantity("lots".to_owned()),
                    ..Default::default()
                },
            );
        }
        bad_quantity
    }

    /// The test device with an attribute with no value set, first in order.
    fn with_an_empty_attribute() -> Device {
        let mut no_value = api_device();
        if let Some(attributes) = no_value.attributes.as_mut() {
            attributes.insert("aaa".to_owned(), DeviceAttribute::default());
        }
        no_value
    }

    /// The selectors a view is held to, each with whether it reads only attribute and capacity
    /// paths (and so is evaluated on the view alone).
    fn view_selectors() -> Vec<(&'static str, bool)> {
        vec![
            (r#"device.driver == "gpu.tessera.dev""#, true),
            (
                r#"device.attributes["gpu.tessera.dev"].type == "gpu""#,
                true,
            ),
            (r#"device.attributes["gpu.tessera.dev"].type"#, true),
            (r#"device.attributes["gpu.tessera.dev"].missing == 1"#, true),
            (r#"device.attributes["other.vendor"].type == "gpu""#, true),
            (
                r#"device.attributes["gpu.tessera.dev"].versions[1].isGreaterThan(semver("2.0.0"))"#,
                true,
            ),
            (
                r#"device.attributes["gpu.tessera.dev"].driverVersion.isLessThan(semver("600.0.0"))"#,
                true,
            ),
            (
                r#"device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci")"#,
                true,
            ),
            (
                r#"device.attributes["gpu.tessera.dev"].links.includes(2)"#,
                true,
            ),
            (
                r#"device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("80Gi")) == 0"#,
                true,
            ),
            (
                r#"device.capacity["gpu.tessera.dev"].nothing.compareTo(quantity("1")) == 0"#,
                true,
            ),
            (r#""type" in device.attributes["gpu.tessera.dev"]"#, true),
            (r#"has(device.attributes["gpu.tessera.dev"].type)"#, true),
            (r#"device.attributes["gpu.tessera.dev"].size() > 2"#, true),
            (r#"size(device.capacity["gpu.tessera.dev"]) == 1"#, true),
            ("device.allowMultipleAllocations", true),
            (
                r#"device.attributes.exists(d, d == "gpu.tessera.dev")"#,
                false,
            ),
            (
                r#"device.capacity["gpu.tessera.dev"] == device.capacity["gpu.tessera.dev"]"#,
                true,
            ),
            (r#"has(device.driver)"#, false),
            (r#"[1].all(device, device == 1)"#, false),
            (
                r#"cel.bind(a, device.attributes["gpu.tessera.dev"], a.type == "gpu")"#,
                true,
            ),
            (r#"device == device"#, false),
        ]
    }

    /// A view answers every selector exactly as the device's context does: values, missing keys
    /// and domains, a name published both qualified and not, invalid devices, and selectors that
    /// need the whole maps (evaluated on a context built for them).
    #[test]
    fn a_view_evaluates_like_the_context() {
        let compiler = SelectorCompiler::new();
        let expressions = view_selectors();
        let devices = [
            api_device(),
            published_twice(),
            with_a_bad_version(),
            with_a_bad_quantity(),
            with_an_empty_attribute(),
        ];
        for device in devices {
            let context = DeviceContext::new("gpu.tessera.dev", &device);
            let view = DeviceView::new("gpu.tessera.dev", &device);
            assert_eq!(view.invalid(), context.invalid());
            for &(expression, paths_only) in &expressions {
                let selector = compiler.compile(expression).unwrap();
                assert_eq!(selector.reads_paths_only(), paths_only, "{expression}");
                assert_eq!(
                    selector.evaluate_view(&view),
                    selector.evaluate(&context),
                    "{expression} on {:?}",
                    device
                        .attributes
                        .as_ref()
                        .map(|a| a.keys().collect::<Vec<_>>())
                );
            }
        }
    }
}
