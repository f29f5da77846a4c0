use super::*;

/// The findings for every object of `yaml`, rendered as the CLI prints them.
fn lint(yaml: &str) -> Vec<String> {
    let linter = Linter::new();
    documents(yaml)
        .unwrap()
        .iter()
        .flat_map(|object| {
            let object_ref = ObjectRef::of(object);
            assert!(object_ref.is_checked_kind(), "{object_ref}");
            linter.lint("f.yaml", &object_ref, object)
        })
        .map(|f| f.to_string())
        .collect()
}

fn device_class(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: {name}\nspec:\n  selectors:\n  - cel:\n      expression: {selector:?}\n"
    )
}

#[test]
fn a_clean_class_has_no_findings() {
    let yaml = device_class(
        "big",
        r#"device.attributes["gpu.tessera.dev"].type == "gpu" && device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("40Gi")) >= 0"#,
    );
    assert_eq!(lint(&yaml), Vec::<String>::new());
}

#[test]
fn misspelled_names_get_the_closest_one() {
    let findings = lint(&device_class(
        "typo",
        r#"device.capacity["gpu.tessera.dev"].memroy.isGreaterThan(quantity("1Gi")) && device.attributes["gpu.tessera.dev"].productname == "x""#,
    ));
    assert_eq!(
        findings,
        [
            r#"f.yaml: DeviceClass/typo: spec.selectors[0]: `device.capacity["gpu.tessera.dev"].memroy`: Tessera publishes no capacity `memroy` (did you mean `memory`?)"#,
            r#"f.yaml: DeviceClass/typo: spec.selectors[0]: `device.attributes["gpu.tessera.dev"].productname`: Tessera publishes no attribute `productname` (did you mean `productName`?)"#,
        ]
    );
}

#[test]
fn names_in_the_wrong_map_or_domain_are_explained() {
    let findings = lint(&device_class(
        "wrong",
        r#"device.attributes["gpu.tessera.dev"].memory == 1 || device.attributes["gpu.tesera.dev"].type == "gpu" || device.attributes["resource.kubernetes.io"].pcieroot == "" || device.attributes["other.vendor.com"].anything"#,
    ));
    assert_eq!(findings.len(), 3, "{findings:#?}");
    assert!(
        findings[0].ends_with(
            "`memory` is not an attribute; read it from `device.capacity[\"gpu.tessera.dev\"]`"
        ),
        "{}",
        findings[0]
    );
    assert!(
        findings[1].ends_with(
            "no device has the domain `gpu.tesera.dev` (did you mean `gpu.tessera.dev`?)"
        ),
        "{}",
        findings[1]
    );
    assert!(findings[2].ends_with("Tessera publishes no attribute `resource.kubernetes.io/pcieroot` (did you mean `pcieRoot`?)"), "{}", findings[2]);
}

#[test]
fn selectors_that_cannot_return_bool() {
    let findings = lint(&device_class(
        "int",
        r#"device.attributes["gpu.tessera.dev"].index"#,
    ));
    assert_eq!(
        findings,
        [
            "f.yaml: DeviceClass/int: spec.selectors[0]: evaluates to int, not bool, on a sample gpu device; compare the value with something"
        ]
    );
    let findings = lint(&device_class("lit", r#"device.driver"#));
    assert_eq!(
        findings,
        [
            "f.yaml: DeviceClass/lit: spec.selectors[0]: must evaluate to bool or the unknown type, not string"
        ]
    );
}

#[test]
fn compile_errors_and_cost() {
    let findings = lint(&device_class(
        "syntax",
        "device.attributes[\"gpu.tessera.dev\"].type ==",
    ));
    assert_eq!(findings.len(), 1);
    assert!(
        findings[0].starts_with(
            "f.yaml: DeviceClass/syntax: spec.selectors[0]: compilation failed: ERROR: <input>:1:"
        ),
        "{}",
        findings[0]
    );
    let nested = "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, [1,2,3,4,5,6,7,8,9,10].all(f, true))))))";
    let findings = lint(&device_class("costly", nested));
    assert!(
        findings
            .iter()
            .any(|f| f.contains("too complex, exceeds cost limit")),
        "{findings:#?}"
    );
    assert!(
        findings
            .iter()
            .any(|f| f.contains("actual cost limit exceeded")),
        "{findings:#?}"
    );
}

#[test]
fn claims_templates_constraints_and_configs() {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: pair, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.tessera.dev
          count: 2
          selectors:
          - cel: {expression: 'device.attributes["gpu.tessera.dev"].nvlinkIsland != ""'}
          - cel: {expression: 'device.attributes["gpu.tessera.dev"].nvlinkIsand != ""'}
      - name: fallback
        firstAvailable:
        - name: big
          deviceClassName: gpu.tessera.dev
          selectors:
          - cel: {expression: '1 +'}
      constraints:
      - requests: [gpus]
        matchAttribute: gpu.tessera.dev/nvlinkIsland
      - requests: [gpus]
        distinctAttribute: gpu.tessera.dev/uuidd
      - requests: [gpus]
        matchAttribute: nvlinkIsland
      config:
      - requests: [gpus]
        opaque:
          driver: gpu.tessera.dev
          parameters: {apiVersion: gpu.tessera.dev/v1alpha1, kind: GpuConfig, sharing: {strategy: Timeslicing}}
      - opaque:
          driver: other.vendor.com
          parameters: {anything: goes}
"#;
    let findings = lint(yaml);
    let prefix = "f.yaml: ResourceClaimTemplate/ml/pair: spec.spec.devices.";
    assert_eq!(findings.len(), 5, "{findings:#?}");
    assert!(
        findings[0].starts_with(&format!("{prefix}requests[0].exactly.selectors[1]: ")),
        "{}",
        findings[0]
    );
    assert!(findings[0].contains("(did you mean `nvlinkIsland`?)"));
    assert!(
        findings[1].starts_with(&format!(
            "{prefix}requests[1].firstAvailable[0].selectors[0]: compilation failed"
        )),
        "{}",
        findings[1]
    );
    assert_eq!(
        findings[2],
        format!(
            "{prefix}constraints[1].distinctAttribute: Tessera publishes no attribute `gpu.tessera.dev/uuidd` (did you mean `gpu.tessera.dev/uuid`?)"
        )
    );
    assert_eq!(
        findings[3],
        format!(
            "{prefix}constraints[2].matchAttribute: `nvlinkIsland` must be fully qualified, as `gpu.tessera.dev/nvlinkIsland`"
        )
    );
    assert!(findings[4].starts_with(&format!("{prefix}config[0].opaque.parameters: invalid gpu.tessera.dev configuration: field `sharing.strategy`")), "{}", findings[4]);
}

#[test]
fn lists_and_malformed_fields() {
    let yaml = r#"
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: c}
  spec:
    devices:
      requests:
      - name: r
        exactly:
          deviceClassName: gpu.tessera.dev
          selectors:
          - cel: {}
      constraints: {}
"#;
    assert_eq!(
        lint(yaml),
        [
            "f.yaml: ResourceClaim/c: spec.devices.requests[0].exactly.selectors[0]: a selector needs a `cel.expression` string",
            "f.yaml: ResourceClaim/c: spec.devices.constraints: must be a list",
        ]
    );
}

#[test]
fn extended_resource_names_must_be_valid_and_given_to_one_class() {
    let class = |name: &str, resource: &str| {
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: {name}\nspec:\n  extendedResourceName: {resource}\n"
        )
    };
    let mut names = ExtendedResourceNames::default();
    let mut found = Vec::new();
    for (file, yaml) in [
        ("tessera.yaml", class("gpu.tessera.dev", "nvidia.com/gpu")),
        (
            "tessera.yaml",
            class("mig-1g.10gb.gpu.tessera.dev", "nvidia.com/mig-1g.10gb.me"),
        ),
        ("nvidia.yaml", class("gpu.nvidia.com", "nvidia.com/gpu")),
        ("bad.yaml", class("a", "gpu")),
        ("bad.yaml", class("b", "kubernetes.io/gpu")),
        ("bad.yaml", class("c", "example.com/-gpu")),
    ] {
        let object = documents(&yaml).unwrap().remove(0);
        found.extend(
            names
                .add(file, &ObjectRef::of(&object), &object)
                .iter()
                .map(|f| f.to_string()),
        );
    }
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found[0].starts_with("nvidia.yaml: DeviceClass/gpu.nvidia.com: spec.extendedResourceName: `nvidia.com/gpu` is also the extendedResourceName of tessera.yaml: DeviceClass/gpu.tessera.dev: kube-scheduler serves it from only one class"),
        "{}",
        found[0]
    );
    for (finding, class) in found[1..].iter().zip(["a", "b", "c"]) {
        assert!(
            finding.starts_with(&format!(
                "bad.yaml: DeviceClass/{class}: spec.extendedResourceName: `"
            )) && finding.contains("is not an extended resource name"),
            "{finding}"
        );
    }
    for good in [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb.me",
        "example.com/a_b",
        "x.y/z",
    ] {
        assert!(is_extended_resource_name(good), "{good}");
    }
    for bad in [
        "gpu",
        "nvidia.com/",
        "/gpu",
        "Nvidia.com/gpu",
        "a.kubernetes.io/x",
        "nvidia.com/gpu.",
        "nvidia.com/a/b",
    ] {
        assert!(!is_extended_resource_name(bad), "{bad}");
    }
}

#[test]
fn nvidia_configs_under_nvidia_driver_name_are_decoded_as_prepare_decodes_them() {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: ml, name: mps}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.tessera.dev}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: 50}}
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: MPS, mpsConfig: {multiUser: true}}
    - opaque:
        driver: gpu.nvidia.com
        parameters: {apiVersion: other.nvidia.com/v1, kind: Whatever}
"#;
    let findings = lint(yaml);
    // The first decodes (MPS, 50%); the second asks for what the plugin refuses at prepare; the
    // third is no resource.nvidia.com/v1beta1 object, so not ours to judge.
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(
        findings[0].starts_with(
            "f.yaml: ResourceClaim/ml/mps: spec.devices.config[1].opaque.parameters: invalid resource.nvidia.com/v1beta1 configuration (driver gpu.nvidia.com, which the gpu.tessera.dev node plugin reads as its own): field `sharing.mpsConfig.multiUser`"
        ),
        "{}",
        findings[0]
    );
}

#[test]
fn an_mps_limit_beyond_any_gpu_is_refused_naming_the_field() {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: ml, name: mps}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.tessera.dev}
    config:
    - opaque:
        driver: gpu.tessera.dev
        parameters:
          apiVersion: gpu.tessera.dev/v1alpha1
          kind: GpuConfig
          sharing: {strategy: MPS, mps: {defaultPinnedDeviceMemoryLimit: 1000000Ei}}
    - opaque:
        driver: gpu.tessera.dev
        parameters:
          apiVersion: gpu.tessera.dev/v1alpha1
          kind: GpuConfig
          sharing: {strategy: MPS, mps: {defaultPinnedDeviceMemoryLimit: 40Gi}}
"#;
    let findings = lint(yaml);
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(
        findings[0].starts_with(
            "f.yaml: ResourceClaim/ml/mps: spec.devices.config[0].opaque.parameters: invalid gpu.tessera.dev configuration: field `sharing.mps.defaultPinnedDeviceMemoryLimit`: `1000000Ei` is more memory than any GPU has"
        ),
        "{}",
        findings[0]
    );
}
