//! A device's attribute by its qualified name, as upstream's `lookupAttribute` finds it: the fully
//! qualified name, or the bare id when the domain is the device's driver.

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

/// The attribute `qualified` of `device`, published by `driver`.
pub(crate) fn lookup_attribute<'d>(
    driver: &str,
    device: &'d Device,
    qualified: &str,
) -> Option<&'d DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    if let Some(a) = attributes.get(qualified) {
        return Some(a);
    }
    let (domain, id) = qualified.split_once('/')?;
    if domain != driver {
        return None;
    }
    attributes.get(id)
}
