//! `tessera validate` run as a binary: it accepts the DeviceClasses Tessera ships and rejects
//! broken ones with a clear message and the documented exit status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tessera_validate(files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("validate")
        .args(files)
        .output()
        .expect("the tessera binary runs")
}

fn shipped_device_classes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tessera/files/deviceclasses.yaml")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("temp file written");
    path
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn accepts_the_shipped_device_classes() {
    let out = tessera_validate(&[&shipped_device_classes()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout(&out), "");
    // gpu.tessera.dev, shared.gpu.tessera.dev, mig.gpu.tessera.dev and one class per MIG profile.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("31 object(s) in 1 file(s): no findings")
    );
}

const BROKEN: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: misspelled
spec:
  selectors:
  - cel:
      expression: device.attributes["gpu.tessera.dev"].type == "gpu"
  - cel:
      expression: device.capacity["gpu.tessera.dev"].memroy.isGreaterThan(quantity("40Gi"))
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: not-bool
spec:
  selectors:
  - cel:
      expression: device.attributes["gpu.tessera.dev"].productName
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: bad-config
spec:
  selectors:
  - cel:
      expression: device.attributes["gpu.tessera.dev"].type == "gpu"
  config:
  - opaque:
      driver: gpu.tessera.dev
      parameters:
        apiVersion: gpu.tessera.dev/v1alpha1
        kind: GpuConfig
        sharing:
          strategy: MPS
          mps:
            defaultActiveThreadPercentage: 150
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: unrelated
"#;

#[test]
fn rejects_misspelled_attributes_non_bool_selectors_and_bad_configs() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "classes.yaml", BROKEN);
    let out = tessera_validate(&[&file]);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    let name = file.display().to_string();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert_eq!(
        lines[0],
        format!(
            "{name}: DeviceClass/misspelled: spec.selectors[1]: `device.capacity[\"gpu.tessera.dev\"].memroy`: Tessera publishes no capacity `memroy` (did you mean `memory`?)"
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{name}: DeviceClass/not-bool: spec.selectors[0]: evaluates to string, not bool, on a sample gpu device; compare the value with something"
        )
    );
    assert!(
        lines[2].starts_with(&format!(
            "{name}: DeviceClass/bad-config: spec.config[0].opaque.parameters: invalid gpu.tessera.dev configuration: field `sharing.mps.defaultActiveThreadPercentage`"
        )),
        "{}",
        lines[2]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note:") && stderr.contains("ConfigMap/unrelated skipped"),
        "{stderr}"
    );
    assert!(
        stderr.contains("3 finding(s) in 3 object(s) from 1 file(s)"),
        "{stderr}"
    );
}

#[test]
fn unreadable_input_is_exit_status_two() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(&dir, "broken.yaml", "kind: [unclosed\n");
    let missing = dir.path().join("missing.yaml");
    let out = tessera_validate(&[&yaml, &missing, &shipped_device_classes()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml: not valid YAML"), "{stderr}");
    assert!(stderr.contains("missing.yaml: cannot read"), "{stderr}");
    assert!(
        stderr.contains("31 object(s) in 1 file(s): no findings; 2 file(s) could not be checked"),
        "{stderr}"
    );
}

#[test]
fn a_second_class_with_the_charts_extended_resource_name_is_a_finding() {
    // NVIDIA's DRA driver names its GPU class nvidia.com/gpu too: installed next to Tessera's
    // chart, kube-scheduler would serve the name from only one of them.
    let dir = tempfile::tempdir().unwrap();
    let nvidia = write(
        &dir,
        "nvidia.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: gpu.nvidia.com\nspec:\n  extendedResourceName: nvidia.com/gpu\n",
    );
    let out = tessera_validate(&[&shipped_device_classes(), &nvidia]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("nvidia.yaml: DeviceClass/gpu.nvidia.com: spec.extendedResourceName: `nvidia.com/gpu` is also the extendedResourceName of ")
            && text.contains("deviceclasses.yaml: DeviceClass/gpu.tessera.dev"),
        "{text}"
    );
}

#[test]
fn json_output_carries_the_same_findings_and_the_unreadable_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "classes.yaml", BROKEN);
    let missing = dir.path().join("missing.yaml");
    let text = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["validate", "-o", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(text.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&text.stdout).expect("JSON on stdout");
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 3, "{report}");
    assert_eq!(findings[0]["object"], "DeviceClass/misspelled");
    assert_eq!(findings[0]["path"], "spec.selectors[1]");
    assert!(
        findings[0]["problem"]
            .as_str()
            .unwrap()
            .contains("did you mean `memory`?"),
        "{report}"
    );
    assert_eq!(findings[2]["object"], "DeviceClass/bad-config");
    assert_eq!(report["checked"], 3);
    assert_eq!(report["files"], 1);
    assert_eq!(report["unreadable"], serde_json::json!([]));

    // An unreadable file: exit status 2, named in the report.
    let both = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["validate", "--output=json"])
        .arg(&file)
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&both.stdout).unwrap();
    assert_eq!(
        report["unreadable"][0]["file"],
        missing.display().to_string()
    );
    assert!(
        report["unreadable"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("cannot read")
    );
    assert_eq!(report["findings"].as_array().unwrap().len(), 3);
}

#[test]
fn a_gpu_quota_key_that_is_never_enforced_is_a_finding_and_the_example_quota_is_clean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let quota = write(
        &dir,
        "quota.yaml",
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {namespace: team-a, name: gpus}\n\
         spec:\n  hard:\n    nvidia.com/gpu: \"4\"\n    requests.cpu: \"8\"\n",
    );
    let out = tessera_validate(&[&quota]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("ResourceQuota/team-a/gpus: spec.hard[\"nvidia.com/gpu\"]")
            && text.contains("write `requests.nvidia.com/gpu`"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "only the GPU key: {text}");

    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples/gpu-quota/gpu-quota.yaml");
    let out = tessera_validate(&[&example]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr)
            .contains("ResourceQuota/tessera-example-gpu-quota/gpus skipped"),
        "the example's quota is checked, not skipped"
    );
}
