//! docs/ARCHITECTURE.md's dependency invariants, checked over `cargo metadata` (the resolved
//! graph of the whole workspace, normal dependencies only, followed transitively):
//!
//! - the pure crates depend on none of `kube`, `tokio`, `tonic`, `hyper`, `axum`;
//! - only `runtime`, `node`, `controller` and `cli` (and the test-only `fake-apiserver` and
//!   `e2e`) depend on `kube`; only `kubelet` and `node` depend on `tonic`;
//! - `fake-apiserver` is nobody's normal dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Crates that are functions of data: no network, no async runtime.
const PURE: &[&str] = &[
    "tessera-api",
    "tessera-cel",
    "tessera-allocator",
    "tessera-topology",
    "tessera-cdi",
    "tessera-placement",
    "tessera-driver-root",
];
const IO: &[&str] = &[
    "kube",
    "kube-client",
    "kube-runtime",
    "tokio",
    "tonic",
    "hyper",
    "axum",
];
const KUBE_USERS: &[&str] = &[
    "tessera-runtime",
    "tessera-node",
    "tessera-controller",
    "tessera-cli",
    "tessera-fake-apiserver",
    "tessera-e2e",
];
const TONIC_USERS: &[&str] = &["tessera-kubelet", "tessera-node"];

/// Workspace member name → names of every package it depends on (normal dependencies,
/// transitively).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
            manifest,
        ])
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    let names: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let normal: BTreeMap<&str, Vec<&str>> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| d["pkg"].as_str().unwrap())
                .collect();
            (node["id"].as_str().unwrap(), deps)
        })
        .collect();
    metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| {
            let member = member.as_str().unwrap();
            let mut seen = BTreeSet::new();
            let mut stack = vec![member];
            while let Some(id) = stack.pop() {
                for dep in &normal[id] {
                    if seen.insert(*dep) {
                        stack.push(dep);
                    }
                }
            }
            (
                names[member].to_owned(),
                seen.iter().map(|id| names[id].to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn the_dependency_invariants_hold() {
    let graph = dependencies();
    for name in PURE.iter().chain(KUBE_USERS).chain(TONIC_USERS) {
        assert!(
            graph.contains_key(*name),
            "{name} is not a workspace member; update this test"
        );
    }
    let mut broken = Vec::new();
    for (member, deps) in &graph {
        let uses = |forbidden: &[&str]| -> Vec<String> {
            forbidden
                .iter()
                .filter(|f| deps.contains(**f))
                .map(|f| f.to_string())
                .collect()
        };
        if PURE.contains(&member.as_str()) {
            let io = uses(IO);
            if !io.is_empty() {
                broken.push(format!("pure crate {member} depends on {io:?}"));
            }
        }
        if !KUBE_USERS.contains(&member.as_str()) && deps.contains("kube") {
            broken.push(format!("{member} depends on kube"));
        }
        if !TONIC_USERS.contains(&member.as_str()) && deps.contains("tonic") {
            broken.push(format!("{member} depends on tonic"));
        }
        if deps.contains("tessera-fake-apiserver") {
            broken.push(format!(
                "{member} depends on tessera-fake-apiserver (a dev-dependency only)"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "docs/ARCHITECTURE.md's invariants are broken:\n{}",
        broken.join("\n")
    );
}
