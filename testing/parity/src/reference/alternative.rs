//! One alternative of a request as the allocator reads it: a request, or one subrequest of
//! `firstAvailable`, with its class, selectors, allocation mode and count.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceToleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// How many devices an alternative takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocationMode {
    /// Exactly this many.
    Exact(usize),
    /// These candidates (positions in the node's candidate list), every one.
    All(Vec<usize>),
}

impl AllocationMode {
    pub fn count(&self) -> usize {
        match self {
            AllocationMode::Exact(n) => *n,
            AllocationMode::All(devices) => devices.len(),
        }
    }
}

/// A request, or one subrequest of a `firstAvailable` request.
#[derive(Debug)]
pub struct Alternative<'a> {
    /// The request's name.
    pub base: &'a str,
    /// The subrequest's name.
    pub sub: Option<&'a str>,
    pub class: &'a DeviceClass,
    pub class_selectors: Vec<&'a str>,
    pub request_selectors: Vec<&'a str>,
    pub mode: AllocationMode,
    pub admin: bool,
    pub tolerations: &'a [DeviceToleration],
    pub capacity: BTreeMap<String, Quantity>,
}

impl Alternative<'_> {
    /// The name results carry: `request` or `request/subrequest`.
    pub fn name(&self) -> String {
        match self.sub {
            Some(sub) => format!("{}/{sub}", self.base),
            None => self.base.to_owned(),
        }
    }
}
