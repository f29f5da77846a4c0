//! `tessera top` over objects written to files (the live path reads the same objects through
//! kubeconfig, `crates/cli/tests/explain_controller.rs` proves the loaders agree), and the binary
//! started as `kubectl-tessera`: its help names `kubectl tessera`, its completions exist.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

/// dgx-h100's slices for node `node-a`, as `tessera inventory` prints them.
fn write_slices(dir: &Path) {
    let out = tessera()
        .args([
            "inventory",
            "--topology",
            "dgx-h100",
            "--node-name",
            "node-a",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(dir.join("slices.yaml"), out.stdout).unwrap();
}

/// A claim holding gpu-0 and gpu-1 of node-a, reserved for pod `trainer`, prepared: the plugin
/// reported gpu-0's UUID in status.devices.
fn claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ml", "name": "pair", "uid": "c1"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 2}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpus", "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0"},
                {"request": "gpus", "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-1"},
            ]}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "p1"}],
            "devices": [{"driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0", "data": {"uuid": "GPU-reported"}}],
        },
    })
}

#[test]
fn top_lists_who_holds_each_gpu_and_free_gpus_per_island() {
    let dir = tempfile::tempdir().unwrap();
    write_slices(dir.path());
    std::fs::write(dir.path().join("claim.json"), claim().to_string()).unwrap();

    let out = tessera()
        .args(["top", "-o", "json", "--objects"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let node = &report["nodes"][0];
    assert_eq!(node["node"], "node-a");
    assert_eq!(node["gpus"], 8);
    assert_eq!(node["freeGpus"], 6);
    let devices = node["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8, "whole GPUs only: no MIG device is held");
    assert_eq!(devices[0]["device"], "gpu-0");
    assert_eq!(devices[0]["heldBy"][0]["claim"], "ml/pair");
    assert_eq!(devices[0]["heldBy"][0]["pods"], json!(["ml/trainer"]));
    assert_eq!(devices[0]["heldBy"][0]["preparedUuid"], "GPU-reported");
    assert_eq!(devices[1]["heldBy"][0]["preparedUuid"], Value::Null);
    assert_eq!(devices[2]["heldBy"], json!([]));
    // dgx-h100: one NVLink island of eight GPUs.
    let islands = node["islands"].as_array().unwrap();
    assert_eq!(islands.len(), 1, "{islands:?}");
    assert_eq!(islands[0]["gpus"], 8);
    assert_eq!(islands[0]["freeGpus"], 6);

    let text = tessera()
        .args(["top", "--objects"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NODE"), "{text}");
    let gpu0 = lines
        .iter()
        .find(|l| l.contains(" gpu-0 "))
        .expect("a gpu-0 row");
    assert!(
        gpu0.contains("ml/trainer") && gpu0.contains("ml/pair (gpus)"),
        "{text}"
    );
    let gpu5 = lines
        .iter()
        .find(|l| l.contains(" gpu-5 "))
        .expect("a gpu-5 row");
    let cells: Vec<&str> = gpu5.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 2..], ["-", "-"], "a free GPU: {gpu5}");
    let island = lines
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.len() == 4 && cells[0] == "node-a")
        .unwrap_or_else(|| panic!("no island summary: {text}"));
    assert_eq!(island[2..], ["8", "6"], "{text}");
}

#[test]
fn started_as_kubectl_tessera_it_calls_itself_so_and_completes() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-tessera");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tessera"), &plugin).unwrap();
    let help = Command::new(&plugin).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("Usage: kubectl tessera <COMMAND>"), "{help}");
    let plain = tessera().arg("--help").output().unwrap();
    assert!(
        String::from_utf8(plain.stdout)
            .unwrap()
            .contains("Usage: tessera <COMMAND>")
    );

    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(&plugin)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success());
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("kubectl-tessera")
                && script.contains("explain")
                && script.contains("top"),
            "{shell}: {script}"
        );
    }
}
