use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceClass;
use pretty_assertions::assert_eq;
use serde::Deserialize;
use serde_json::{Value, json};

use super::*;

/// The chart's DeviceClasses, as the cluster serves them.
fn chart_classes() -> Vec<DeviceClass> {
    let text = include_str!("../../../../deploy/helm/tessera/files/deviceclasses.yaml");
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| DeviceClass::deserialize(doc).expect("the chart's classes parse"))
        .collect()
}

fn table() -> ConversionTable {
    ConversionTable::from_device_classes(&chart_classes())
}

fn gpu_pod(limits: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "busybox",
                "resources": {"limits": limits, "requests": limits}
            }]
        }
    })
}

#[test]
fn the_table_holds_whole_gpus_and_mig_profiles_of_the_chart_only() {
    let table = table();
    assert_eq!(table.class_for("nvidia.com/gpu"), Some("gpu.tessera.dev"));
    assert_eq!(
        table.class_for("nvidia.com/mig-1g.10gb"),
        Some("mig-1g.10gb.gpu.tessera.dev")
    );
    assert_eq!(
        table.class_for("nvidia.com/mig-1g.5gb.me"),
        Some("mig-1g.5gb.me.gpu.tessera.dev")
    );
    // A share of one GPU gains nothing from topology placement: left to the scheduler.
    assert_eq!(table.class_for("nvidia.com/gpu.shared"), None);
    assert_eq!(table.class_for("example.com/nic"), None);
}

#[test]
fn a_class_that_does_not_exist_is_not_converted_to() {
    let classes: Vec<DeviceClass> = chart_classes()
        .into_iter()
        .filter(|c| c.metadata.name.as_deref() != Some("gpu.tessera.dev"))
        .collect();
    let table = ConversionTable::from_device_classes(&classes);
    assert_eq!(table.class_for("nvidia.com/gpu"), None);
    assert_eq!(
        convert(&gpu_pod(json!({"nvidia.com/gpu": "4"})), &table),
        Err(Unconverted::NothingToConvert)
    );
    assert!(ConversionTable::from_device_classes(&[]).is_empty());
}

#[test]
fn a_four_gpu_pod_gets_a_claim_from_a_template_and_the_gate() {
    let pod = gpu_pod(json!({"nvidia.com/gpu": "4", "cpu": "2"}));
    let conversion = convert(&pod, &table()).expect("converted");
    let annotation = serde_json::to_string(&conversion.requests).unwrap();
    assert_eq!(
        conversion.object,
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "train",
                "namespace": "team-a",
                "annotations": {"gpu.tessera.dev/device-plugin-conversion": annotation}
            },
            "spec": {
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "limits": {"cpu": "2"},
                        "requests": {"cpu": "2"},
                        "claims": [{"name": "tessera-gpu-c0"}]
                    }
                }],
                "resourceClaims": [{"name": "tessera-gpu-c0", "resourceClaimTemplateName": "tessera-gpu-4"}],
                "schedulingGates": [{"name": "gpu.tessera.dev/topology-aware"}]
            }
        })
    );
    assert_eq!(
        conversion.requests,
        vec![ConvertedRequest {
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            count: 4,
            claim: "tessera-gpu-c0".into(),
            template: "tessera-gpu-4".into(),
            device_class: "gpu.tessera.dev".into(),
        }]
    );
}

#[test]
fn the_patch_turns_the_original_into_the_converted_pod() {
    let mut pod = gpu_pod(json!({"nvidia.com/gpu": 2}));
    pod["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}]);
    pod["metadata"]["annotations"] = json!({"team": "a"});
    let conversion = convert(&pod, &table()).expect("converted");
    let patch = conversion.patch_from(&pod);
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies");
    assert_eq!(patched, conversion.object);
    // Another gate stays, Tessera's comes after it; other annotations stay.
    assert_eq!(
        patched["spec"]["schedulingGates"],
        json!([{"name": "example.com/hold"}, {"name": "gpu.tessera.dev/topology-aware"}])
    );
    assert_eq!(patched["metadata"]["annotations"]["team"], "a");
}

#[test]
fn converting_a_converted_pod_changes_nothing() {
    let pod = gpu_pod(json!({"nvidia.com/gpu": "4"}));
    let once = convert(&pod, &table()).expect("converted");
    assert_eq!(convert(&once.object, &table()), Err(Unconverted::HasClaims));
}

#[test]
fn tesseras_gate_is_not_added_twice() {
    let mut pod = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    pod["spec"]["schedulingGates"] = json!([{"name": "gpu.tessera.dev/topology-aware"}]);
    let conversion = convert(&pod, &table()).expect("converted");
    assert_eq!(
        conversion.object["spec"]["schedulingGates"],
        json!([{"name": "gpu.tessera.dev/topology-aware"}])
    );
}

#[test]
fn fields_this_build_does_not_know_survive() {
    let mut pod = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    pod["spec"]["someFutureField"] = json!({"x": 1});
    pod["spec"]["containers"][0]["resources"]["someFutureResourceField"] = json!(true);
    let conversion = convert(&pod, &table()).expect("converted");
    assert_eq!(
        conversion.object["spec"]["someFutureField"],
        json!({"x": 1})
    );
    assert_eq!(
        conversion.object["spec"]["containers"][0]["resources"]["someFutureResourceField"],
        json!(true)
    );
    let ops = serde_json::to_value(conversion.patch_from(&pod)).unwrap();
    assert!(
        !ops.to_string().contains("someFuture"),
        "the patch touches only what the conversion changes: {ops}"
    );
}

#[test]
fn mig_devices_get_their_profile_class() {
    let pod = gpu_pod(json!({"nvidia.com/mig-1g.10gb": "2"}));
    let conversion = convert(&pod, &table()).expect("converted");
    assert_eq!(
        conversion.object["spec"]["resourceClaims"],
        json!([{"name": "tessera-mig-1g-10gb-c0", "resourceClaimTemplateName": "tessera-mig-1g.10gb-2"}])
    );
    assert_eq!(
        conversion.requests[0].device_class,
        "mig-1g.10gb.gpu.tessera.dev"
    );
}

#[test]
fn each_container_gets_its_own_claim() {
    let pod = json!({
        "metadata": {"name": "two"},
        "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "sidecar", "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "1"}}}
        ]}
    });
    let conversion = convert(&pod, &table()).expect("converted");
    let claims: Vec<(&str, &str)> = conversion
        .requests
        .iter()
        .map(|r| (r.container.as_str(), r.claim.as_str()))
        .collect();
    assert_eq!(
        claims,
        [
            ("a", "tessera-gpu-c0"),
            ("b", "tessera-gpu-c2"),
            ("b", "tessera-mig-1g-10gb-c2")
        ]
    );
    assert_eq!(
        conversion.object["spec"]["containers"][1],
        pod["spec"]["containers"][1]
    );
    assert_eq!(
        conversion.object["spec"]["containers"][2]["resources"],
        json!({"claims": [{"name": "tessera-gpu-c2"}, {"name": "tessera-mig-1g-10gb-c2"}]})
    );
    // Two claims of one shape share a template.
    let templates: Vec<String> = conversion
        .templates(Some("ns"))
        .iter()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(templates, ["tessera-gpu-2", "tessera-mig-1g.10gb-1"]);
}

#[test]
fn a_template_holds_one_exact_request_and_nothing_kueue_would_refuse() {
    let template = template("gpu.tessera.dev", 4, Some("team-a"));
    assert_eq!(
        serde_json::to_value(&template).unwrap(),
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": "tessera-gpu-4",
                "namespace": "team-a",
                "labels": {"app.kubernetes.io/managed-by": "tessera-controller"}
            },
            "spec": {"spec": {"devices": {"requests": [{
                "name": "devices",
                "exactly": {"deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": 4}
            }]}}}
        })
    );
}

#[test]
fn pods_that_are_left_as_written() {
    let table = table();
    let mut with_claims = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    with_claims["spec"]["resourceClaims"] = json!([{"name": "mine", "resourceClaimName": "mine"}]);
    assert_eq!(convert(&with_claims, &table), Err(Unconverted::HasClaims));

    let mut bound = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    bound["spec"]["nodeName"] = json!("node-1");
    assert_eq!(
        convert(&bound, &table),
        Err(Unconverted::Bound {
            node: "node-1".into()
        })
    );

    let mut init = gpu_pod(json!({"nvidia.com/gpu": "1"}));
    init["spec"]["initContainers"] =
        json!([{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
    assert_eq!(
        convert(&init, &table),
        Err(Unconverted::InitContainer {
            container: "warm".into(),
            resource: "nvidia.com/gpu".into()
        })
    );

    let shared = gpu_pod(json!({"nvidia.com/gpu.shared": "1"}));
    assert_eq!(convert(&shared, &table), Err(Unconverted::NothingToConvert));
    let zero = gpu_pod(json!({"nvidia.com/gpu": "0"}));
    assert_eq!(convert(&zero, &table), Err(Unconverted::NothingToConvert));
    assert_eq!(
        convert(&json!({"metadata": {}}), &table),
        Err(Unconverted::NoPodSpec)
    );

    let half = gpu_pod(json!({"nvidia.com/gpu": "500m"}));
    assert_eq!(
        convert(&half, &table),
        Err(Unconverted::NotACount {
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            quantity: "500m".into()
        })
    );

    let mut differ = gpu_pod(json!({"nvidia.com/gpu": "2"}));
    differ["spec"]["containers"][0]["resources"]["requests"] = json!({"nvidia.com/gpu": "1"});
    assert_eq!(
        convert(&differ, &table),
        Err(Unconverted::LimitAndRequestDiffer {
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            limit: "2".into(),
            request: "1".into()
        })
    );
}

#[test]
fn a_pod_template_converts_like_a_pod() {
    let template = json!({
        "metadata": {"labels": {"app": "train"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}
    });
    let conversion = convert(&template, &table()).expect("converted");
    assert_eq!(
        conversion.object["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
        "tessera-gpu-8"
    );
    assert_eq!(conversion.object["metadata"]["labels"]["app"], "train");
}

#[test]
fn template_names_follow_the_class() {
    assert_eq!(template_name("gpu.tessera.dev", 4), "tessera-gpu-4");
    assert_eq!(
        template_name("mig-3g.40gb.gpu.tessera.dev", 1),
        "tessera-mig-3g.40gb-1"
    );
}

#[test]
fn a_converted_pods_record_names_the_templates_the_controller_creates() {
    let converted = convert(&gpu_pod(json!({"nvidia.com/gpu": "4"})), &table()).unwrap();
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(converted.object["metadata"]["annotations"].clone()).unwrap();
    assert_eq!(recorded(Some(&annotations)), converted.requests);
    let template = recorded_template(Some(&annotations), "tessera-gpu-4", "team-a").unwrap();
    assert_eq!(
        template,
        converted.templates(Some("team-a")).remove(0),
        "the template the webhook's conversion names"
    );
    assert_eq!(template.metadata.namespace.as_deref(), Some("team-a"));
    // Only templates the record names, under the names the conversion gives them.
    assert_eq!(
        recorded_template(Some(&annotations), "tessera-gpu-8", "team-a"),
        None
    );
    let mut forged = annotations.clone();
    forged.insert(
        DEVICE_PLUGIN_CONVERSION_ANNOTATION.to_owned(),
        r#"[{"container":"c","resource":"nvidia.com/gpu","count":4,"claim":"x","template":"my-template","deviceClass":"gpu.tessera.dev"}]"#.to_owned(),
    );
    assert_eq!(
        recorded_template(Some(&forged), "my-template", "team-a"),
        None
    );
    assert!(recorded(None).is_empty());
    let mut unreadable = BTreeMap::new();
    unreadable.insert(
        DEVICE_PLUGIN_CONVERSION_ANNOTATION.to_owned(),
        "{".to_owned(),
    );
    assert!(recorded(Some(&unreadable)).is_empty());
}
