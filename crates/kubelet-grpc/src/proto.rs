//! Rust code generated from the kubelet protocols in `proto/` (see `proto/README.md`).
//!
//! Most users need only the domain types of this crate; these modules are public so that tests
//! (and the [`crate::simulator`]) can send requests the domain types cannot express, such as
//! malformed ones.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the DRA service advertised as `v1.DRAPlugin`.
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the DRA service advertised as `v1beta1.DRAPlugin`.
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `pluginregistration`: the kubelet plugin-watcher registration service.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `v1alpha1`: the device health stream advertised as `v1alpha1.DRAResourceHealth`.
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1`: the device health stream advertised as `v1.DRAResourceHealth` (kubelet 1.37+).
pub mod health_v1 {
    tonic::include_proto!("v1");
}
