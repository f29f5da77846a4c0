//! `tessera migrate` run as a binary on our copies of NVIDIA's quickstart, selectors and
//! consumable-shares manifests and on device-plugin configs: the output passes
//! `tessera validate` (which flags the unmigrated input), keeps nothing of NVIDIA's names, and the
//! migrated quickstart, selectors and consumable-shares demos are the examples the e2e suite runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .output()
        .expect("the tessera binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia")
}

fn manifests(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(manifests(&path));
        } else if path.extension().is_some_and(|e| e == "yaml") {
            found.push(path);
        }
    }
    found.sort();
    found
}

#[test]
fn nvidia_manifests_migrate_into_objects_that_validate() {
    let mut inputs = Vec::new();
    for group in ["quickstart", "selectors", "consumable-shares"] {
        inputs.extend(manifests(&fixtures().join(group)));
    }
    assert!(inputs.len() >= 8, "{inputs:?}");
    for input in inputs {
        let shown = input.display().to_string();
        // What the linter says about the input: NVIDIA's domain is a finding wherever CEL reads it.
        let before = tessera(&["validate", &shown]);
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().to_str().unwrap();
        let migrated = tessera(&["migrate", &shown, "-o", dir]);
        assert_eq!(
            migrated.status.code(),
            Some(0),
            "{shown}: {}",
            text(&migrated.stderr)
        );
        let stderr = text(&migrated.stderr);
        assert!(
            stderr.contains(" change(s), 0 thing(s) not carried over"),
            "{shown}: {stderr}"
        );
        let written = manifests(out.path());
        if written.is_empty() {
            // Only NVIDIA's own DeviceClasses, which Tessera's chart replaces.
            assert!(
                stderr.contains("NVIDIA's DeviceClass `gpu.nvidia.com` dropped"),
                "{stderr}"
            );
            continue;
        }
        for file in &written {
            let body = std::fs::read_to_string(file).unwrap();
            for gone in ["gpu.nvidia.com", "mig.nvidia.com"] {
                assert!(!body.contains(gone), "{shown}: `{gone}` left in\n{body}");
            }
            // NVIDIA's config fields are translated, except where per-device keys must wait
            // for the plugin (which says so).
            if !stderr.contains("kept as resource.nvidia.com/v1beta1") {
                for gone in ["resource.nvidia.com", "mpsConfig", "timeSlicingConfig"] {
                    assert!(!body.contains(gone), "{shown}: `{gone}` left in\n{body}");
                }
            }
        }
        let args: Vec<&str> = std::iter::once("validate")
            .chain(written.iter().map(|p| p.to_str().unwrap()))
            .collect();
        let after = tessera(&args);
        assert_eq!(
            (after.status.code(), text(&after.stdout)),
            (Some(0), String::new()),
            "{shown}: the migrated objects do not validate: {}",
            text(&after.stderr)
        );
        let before_text = text(&before.stdout);
        if before_text.contains("device.") {
            assert!(
                before_text.contains("is NVIDIA's driver's domain"),
                "{shown}: {before_text}"
            );
        }
    }
}

#[test]
fn the_v1beta1_mig_mps_claim_keeps_nvidia_per_device_keys_for_the_plugin() {
    let input = fixtures().join("quickstart/v1beta1/gpu-test3.yaml");
    let migrated = tessera(&["migrate", input.to_str().unwrap()]);
    assert_eq!(
        migrated.status.code(),
        Some(0),
        "{}",
        text(&migrated.stderr)
    );
    let out = text(&migrated.stdout);
    assert!(out.contains("apiVersion: resource.k8s.io/v1\n"), "{out}");
    assert!(!out.contains("resource.k8s.io/v1beta1"), "{out}");
    assert!(
        out.contains("deviceClassName: mig.gpu.tessera.dev"),
        "{out}"
    );
    // Index keys are relative to the devices the config applies to: the plugin resolves them.
    assert!(
        out.contains("apiVersion: resource.nvidia.com/v1beta1")
            && out.contains("driver: gpu.tessera.dev"),
        "{out}"
    );
    assert!(text(&migrated.stderr).contains("resolved by the node plugin"));
}

#[test]
fn the_migrated_demos_are_the_e2e_examples() {
    for (fixture, example) in [
        ("quickstart/gpu-test2.yaml", "nvidia-quickstart"),
        ("selectors/claims.yaml", "nvidia-selectors"),
        (
            "consumable-shares/integer-sharing.yaml",
            "nvidia-shares-integer",
        ),
        (
            "consumable-shares/memory-sharing.yaml",
            "nvidia-shares-memory",
        ),
    ] {
        let input = fixtures().join(fixture);
        let migrated = tessera(&["migrate", input.to_str().unwrap()]);
        assert_eq!(
            migrated.status.code(),
            Some(0),
            "{fixture}: {}",
            text(&migrated.stderr)
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../deploy/examples/{example}/{example}.yaml"));
        let expected =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            text(&migrated.stdout),
            expected,
            "regenerate with: tessera migrate crates/cli/tests/fixtures/nvidia/{fixture} > deploy/examples/{example}/{example}.yaml"
        );
    }
}

#[test]
fn device_plugin_configs_become_chart_values() {
    let dir = fixtures().join("device-plugin");
    // No objects: the values go to stdout.
    let migrated = tessera(&["migrate", dir.join("mps.yaml").to_str().unwrap()]);
    assert_eq!(
        migrated.status.code(),
        Some(0),
        "{}",
        text(&migrated.stderr)
    );
    let values: serde_yaml::Value = serde_yaml::from_slice(&migrated.stdout).unwrap();
    assert_eq!(values["kubeletPlugin"]["sharing"]["consumableShares"], 8);
    assert_eq!(values["kubeletPlugin"]["driverRoot"], "/run/nvidia/driver");
    assert_eq!(
        values["extendedResources"]["sharedGpu"],
        "nvidia.com/gpu.shared"
    );
    assert!(text(&migrated.stderr).contains("MPS: give the claims"));

    let out = tempfile::tempdir().unwrap();
    let migrated = tessera(&[
        "migrate",
        dir.join("time-slicing-configmap.yaml").to_str().unwrap(),
        "-o",
        out.path().to_str().unwrap(),
    ]);
    // Its replicas were still called `nvidia.com/gpu` (no renameByDefault): said, exit status 1.
    assert_eq!(
        migrated.status.code(),
        Some(1),
        "{}",
        text(&migrated.stderr)
    );
    assert!(text(&migrated.stderr).contains("must ask `nvidia.com/gpu.shared`"));
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(out.path().join("values.yaml")).unwrap())
            .unwrap();
    assert_eq!(values["kubeletPlugin"]["sharing"]["consumableShares"], 4);
    assert_eq!(values["extendedResources"]["migPrefix"], "nvidia.com/mig-");
}

#[test]
fn what_cannot_be_carried_over_is_reported_with_exit_status_1() {
    let out = tempfile::tempdir().unwrap();
    let input = out.path().join("in.yaml");
    std::fs::write(
        &input,
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: ns, name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: vfio.gpu.nvidia.com}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: VfioDeviceConfig}
"#,
    )
    .unwrap();
    let migrated = tessera(&["migrate", input.to_str().unwrap()]);
    assert_eq!(migrated.status.code(), Some(1));
    let stderr = text(&migrated.stderr);
    assert!(
        stderr.contains("ResourceClaim/ns/c: not carried over: spec.devices.requests[0].exactly.deviceClassName: DeviceClass `vfio.gpu.nvidia.com` is NVIDIA's"),
        "{stderr}"
    );
    assert!(stderr.contains("VFIO passthrough"), "{stderr}");
    assert!(stderr.contains("2 thing(s) not carried over"), "{stderr}");
    let missing = tessera(&["migrate", "/nonexistent/file.yaml"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_compute_domain_and_its_job_in_two_files_become_one_shared_claim_that_validates() {
    let dir = fixtures().join("compute-domain");
    let inputs: Vec<String> = manifests(&dir)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(inputs.len(), 2, "{inputs:?}");
    let out = tempfile::tempdir().unwrap();
    let mut args = vec!["migrate", "-o", out.path().to_str().unwrap()];
    args.extend(inputs.iter().map(String::as_str));
    let migrated = tessera(&args);
    let stderr = text(&migrated.stderr);
    // spec.numNodes is the one thing not carried over.
    assert_eq!(migrated.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 thing(s) not carried over"), "{stderr}");
    assert!(stderr.contains("spec.numNodes"), "{stderr}");
    let domain = std::fs::read_to_string(out.path().join("compute-domain.yaml")).unwrap();
    assert!(domain.contains("kind: ResourceClaim\n"), "{domain}");
    assert!(domain.contains("name: nvlink-job-channel"), "{domain}");
    assert!(
        domain.contains("deviceClassName: imex.gpu.tessera.dev"),
        "{domain}"
    );
    let job = std::fs::read_to_string(out.path().join("job.yaml")).unwrap();
    assert!(
        job.contains("resourceClaimName: nvlink-job-channel"),
        "{job}"
    );
    assert!(
        !job.contains("resourceClaimTemplateName: nvlink-job-channel"),
        "{job}"
    );
    assert!(
        job.contains("resourceClaimTemplateName: four-gpus"),
        "{job}"
    );
    assert!(!job.contains("gpu.nvidia.com"), "{job}");
    let written: Vec<PathBuf> = manifests(out.path());
    let mut validate = vec!["validate".to_owned()];
    validate.extend(written.iter().map(|p| p.display().to_string()));
    let validate: Vec<&str> = validate.iter().map(String::as_str).collect();
    let after = tessera(&validate);
    assert_eq!(
        (after.status.code(), text(&after.stdout)),
        (Some(0), String::new()),
        "the migrated objects do not validate: {}",
        text(&after.stderr)
    );
}
