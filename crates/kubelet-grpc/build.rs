//! Compiles the kubelet gRPC protocols in `proto/` (repository root) into Rust.
//!
//! `protox` parses the .proto files in pure Rust, so building needs no `protoc`.

use std::path::PathBuf;

/// The .proto files, relative to the `proto/` directory.
const PROTOS: [&str; 5] = [
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    for file in PROTOS {
        println!("cargo:rerun-if-changed={}", proto_root.join(file).display());
    }
    let descriptors = protox::compile(PROTOS, [&proto_root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
