//! Builders of the Kubernetes objects many tests are made of, written once.

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceSelector,
    ExactDeviceRequest,
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
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: expression.into(),
                }),
            }]),
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
