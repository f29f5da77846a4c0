//! docs/ARCHITECTURE.md's dependency invariants, checked over `cargo metadata` (the resolved
//! graph of the whole workspace, normal dependencies only, followed transitively):
//!
//! - the pure crates depend on none of `kube`, `tokio`, `tonic`, `hyper`, `axum`;
//! - only `process`, `node`, `controller` and `cli` (and the test-only `fake-apiserver`,
//!   `controller-harness` and `e2e`) depend on `kube`; only `kubelet-grpc`, what implements or
//!   serves its driver trait (`prepare`, `node`) and the test-only `prepare-harness` and `e2e`
//!   depend on `tonic`;
//! - the prepare core (`prepare`) depends on neither the node plugin (`node`) nor `kube`, nor the
//!   process plumbing (`process`): the daemon implements the core's traits, never the reverse;
//! - `fake-apiserver` is nobody's normal dependency but the test harnesses', and the harnesses
//!   (`controller-harness`, `prepare-harness`) are nobody's; `test-support` is none but the
//!   parity tool's and `controller-harness`'s (test tooling, never shipped).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Crates that are functions of data: no network, no async runtime.
const PURE: &[&str] = &[
    "tessera-api",
    "tessera-cel",
    "tessera-allocator",
    "tessera-gpu-inventory",
    "tessera-cdi",
    "tessera-placement",
    "tessera-admission",
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
    "tessera-process",
    "tessera-node",
    "tessera-controller",
    "tessera-cli",
    "tessera-fake-apiserver",
    "tessera-controller-harness",
    "tessera-e2e",
];
/// `tessera-prepare`: through `tessera-kubelet-grpc`, whose driver trait and domain types it
/// implements (it has no gRPC code of its own), and so the test-only `tessera-prepare-harness`.
/// `tessera-e2e`: the stand-in kubelet plugin of another driver (test tooling, never shipped).
const TONIC_USERS: &[&str] = &[
    "tessera-kubelet-grpc",
    "tessera-prepare",
    "tessera-prepare-harness",
    "tessera-node",
    "tessera-e2e",
];
/// The prepare core and what it must never depend on: the daemon around it, the API server's
/// client, the process plumbing (which brings `kube`).
const PREPARE_CORE: &str = "tessera-prepare";
const NOT_IN_PREPARE_CORE: &[&str] = &[
    "tessera-node",
    "kube",
    "kube-client",
    "kube-runtime",
    "tessera-process",
];
/// Test tooling that is never shipped and may take `tessera-test-support` as a normal
/// dependency (the parity tool's benchmark shares the scheduler_perf fixture).
const TEST_TOOLS: &[&str] = &["tessera-parity", "tessera-controller-harness"];
/// Test-only libraries, taken as dev-dependencies only, that may take the API-server fake as a
/// normal dependency (the controller running in-process against it; the prepare driver on fakes).
const TEST_HARNESSES: &[&str] = &["tessera-controller-harness", "tessera-prepare-harness"];

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
    for name in PURE
        .iter()
        .chain(KUBE_USERS)
        .chain(TONIC_USERS)
        .chain(TEST_HARNESSES)
        .chain([&PREPARE_CORE])
    {
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
        if member == PREPARE_CORE {
            let daemon = uses(NOT_IN_PREPARE_CORE);
            if !daemon.is_empty() {
                broken.push(format!("the prepare core {member} depends on {daemon:?}"));
            }
        }
        if !KUBE_USERS.contains(&member.as_str()) && deps.contains("kube") {
            broken.push(format!("{member} depends on kube"));
        }
        if !TONIC_USERS.contains(&member.as_str()) && deps.contains("tonic") {
            broken.push(format!("{member} depends on tonic"));
        }
        if deps.contains("tessera-fake-apiserver") && !TEST_HARNESSES.contains(&member.as_str()) {
            broken.push(format!(
                "{member} depends on tessera-fake-apiserver (a dev-dependency only)"
            ));
        }
        for harness in TEST_HARNESSES.iter().filter(|h| deps.contains(**h)) {
            broken.push(format!(
                "{member} depends on {harness} (a dev-dependency only)"
            ));
        }
        if deps.contains("tessera-test-support") && !TEST_TOOLS.contains(&member.as_str()) {
            broken.push(format!(
                "{member} depends on tessera-test-support (a dev-dependency only)"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "docs/ARCHITECTURE.md's invariants are broken:\n{}",
        broken.join("\n")
    );
}

/// The workspace root.
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every text file of the project (sources, docs, chart, scripts), skipping build outputs, VCS
/// data and vendored or generated trees.
fn project_files() -> Vec<std::path::PathBuf> {
    const SKIP_DIRS: &[&str] = &["target", ".git", "node_modules", "vendor", "testdata"];
    const TEXT: &[&str] = &[
        "rs", "md", "toml", "yaml", "yml", "tpl", "txt", "sh", "go", "json", "proto",
    ];
    let mut files = Vec::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("project directories are readable") {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                if !SKIP_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if kind.is_file() {
                let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
                let script = path.parent().is_some_and(|p| {
                    p.ends_with("scripts")
                        || p.file_name().is_some_and(|n| n == ".ci")
                        || p.ends_with("tests/e2e")
                });
                if ext.as_deref().is_some_and(|e| TEXT.contains(&e)) || (ext.is_none() && script) {
                    files.push(path);
                }
            }
        }
    }
    files
}

/// The project documents itself: code comments, help texts and docs cite only files in the
/// tree. A `docs/<name>.md` named anywhere exists, and nothing refers to documents outside the
/// repository (design notes the project does not ship).
#[test]
fn docs_cite_only_files_in_the_tree() {
    let outside = regex::Regex::new(r"\bdesign\.md\b|\.\./shared/").unwrap();
    let doc_ref = regex::Regex::new(r"\bdocs/([A-Za-z0-9_-]+\.md)\b").unwrap();
    let mut problems = Vec::new();
    let files = project_files();
    assert!(
        files.len() > 100,
        "the walk found only {} files: is the root right?",
        files.len()
    );
    let this_file = std::path::Path::new(file!())
        .file_name()
        .unwrap()
        .to_owned();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            if file.file_name() != Some(this_file.as_os_str()) && outside.is_match(line) {
                problems.push(format!(
                    "{shown}:{}: cites a document outside the repository: {}",
                    n + 1,
                    line.trim()
                ));
            }
            for cap in doc_ref.captures_iter(line) {
                if !root().join("docs").join(&cap[1]).is_file() {
                    problems.push(format!(
                        "{shown}:{}: names docs/{}, which does not exist",
                        n + 1,
                        &cap[1]
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "cite files in the tree (bring what is needed into docs/ in our own words):\n{}",
        problems.join("\n")
    );
}

/// Every entry of `[workspace.dependencies]` is used by some member: a dependency nobody uses
/// is build time, audit surface and lock-file churn for nothing.
#[test]
fn every_workspace_dependency_is_used() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let table = manifest
        .split("[workspace.dependencies]")
        .nth(1)
        .expect("the root manifest has [workspace.dependencies]");
    let table = table.split("\n[").next().unwrap();
    let declared: Vec<&str> = table
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            line.split_once('=').map(|(name, _)| name.trim())
        })
        .collect();
    assert!(declared.len() > 20, "parsed only {declared:?}");
    let members: Vec<String> = project_files()
        .into_iter()
        .filter(|f| {
            f.file_name().is_some_and(|n| n == "Cargo.toml") && *f != root().join("Cargo.toml")
        })
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let unused: Vec<&str> = declared
        .into_iter()
        .filter(|name| {
            let uses = regex::Regex::new(&format!(
                r"(?m)^\s*{}\s*(\.workspace\s*=\s*true|=\s*\{{[^}}]*workspace\s*=\s*true)",
                regex::escape(name)
            ))
            .unwrap();
            !members.iter().any(|m| uses.is_match(m))
        })
        .collect();
    assert!(
        unused.is_empty(),
        "[workspace.dependencies] entries no member uses (remove them): {unused:?}"
    );
}
