//! Builders of the Kubernetes objects many tests are made of, written once.

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceAttribute, DeviceClass, DeviceClassSpec, DeviceRequest,
    DeviceSelector, ExactDeviceRequest,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A DeviceClass with one CEL selector.
pub fn cel_class(name: &str, expression: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![cel_selector(expression)]),
            ..Default::default()
        }),
    }
}

/// An `ExactCount` request for `count` devices of `class`.
pub fn exact_request(name: &str, class: &str, count: i64) -> DeviceRequest {
    DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(count),
            ..Default::default()
        }),
        first_available: None,
    }
}

/// A device selector with one CEL expression.
pub fn cel_selector(expression: &str) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: expression.into(),
        }),
    }
}

/// A string device attribute.
pub fn string_attr(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.into()),
        ..Default::default()
    }
}

/// An integer device attribute.
pub fn int_attr(value: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value),
        ..Default::default()
    }
}

/// A boolean device attribute.
pub fn bool_attr(value: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(value),
        ..Default::default()
    }
}

/// A semantic-version device attribute.
pub fn version_attr(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value.into()),
        ..Default::default()
    }
}
