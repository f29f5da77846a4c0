//! Objects the scenarios create beyond the examples: GPU claims and pods that use them, built
//! the same way the examples are written (busybox printing its GPU environment, then idling).

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, PostParams};
use tessera_api::DRIVER_NAME;
use tessera_api::names::{GPU_DEVICE_CLASS, TOPOLOGY_AWARE_GATE};

/// What the example containers run: print the GPU environment, then idle until stopped.
pub const PRINT_GPU_ENV: &str = "command -v tessera-gpu-check >/dev/null && tessera-gpu-check; \
     env | grep -E '^(NVIDIA|CUDA|TESSERA)_' | sort; trap 'exit 0' TERM; sleep 86400 & wait";

/// A claim for `count` whole GPUs, optionally narrowed by one CEL selector.
pub fn gpu_claim(
    namespace: &str,
    name: &str,
    count: u32,
    selector: Option<&str>,
) -> anyhow::Result<ResourceClaim> {
    let mut exactly = serde_json::json!({
        "deviceClassName": GPU_DEVICE_CLASS,
        "count": count,
    });
    if let Some(expression) = selector {
        exactly["selectors"] = serde_json::json!([{"cel": {"expression": expression}}]);
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    }))
    .context("building a ResourceClaim")
}

/// A claim for one whole GPU shared through MPS, as deploy/examples/mps writes it: each client
/// may use `percentage` % of the SMs and pin `pinned` (a quantity) of device memory.
pub fn mps_claim(
    namespace: &str,
    name: &str,
    percentage: u32,
    pinned: &str,
) -> anyhow::Result<ResourceClaim> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {"deviceClassName": GPU_DEVICE_CLASS}}],
            "config": [{"requests": ["gpus"], "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": "gpu.tessera.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mps": {
                        "defaultActiveThreadPercentage": percentage,
                        "defaultPinnedDeviceMemoryLimit": pinned,
                    }},
                },
            }}],
        }},
    }))
    .context("building an MPS ResourceClaim")
}

/// Where a pod goes.
#[derive(Debug, Clone, Copy)]
pub enum PlacedBy<'a> {
    /// Gated with `gpu.tessera.dev/topology-aware`: the Tessera controller allocates.
    TopologyAware,
    /// The default scheduler, restricted to one node.
    SchedulerOn(&'a str),
}

/// What a container runs to report again and again: the checker and the GPU environment once,
/// as the examples do, then the checker every 2 s until stopped (a scenario reads its latest
/// report after something changed on the node).
pub const CHECK_EVERY_2S: &str = "command -v tessera-gpu-check >/dev/null && tessera-gpu-check; \
     env | grep -E '^(NVIDIA|CUDA)_' | sort; trap 'exit 0' TERM; \
     while :; do sleep 2 & wait; tessera-gpu-check; done";

/// A pod with one container using claim `claim`.
pub fn gpu_pod(
    namespace: &str,
    name: &str,
    claim: &str,
    placement: PlacedBy<'_>,
) -> anyhow::Result<Pod> {
    gpu_pod_running(namespace, name, claim, placement, PRINT_GPU_ENV)
}

/// A pod with one container using claim `claim` and running the shell script `script`.
pub fn gpu_pod_running(
    namespace: &str,
    name: &str,
    claim: &str,
    placement: PlacedBy<'_>,
    script: &str,
) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "terminationGracePeriodSeconds": 5,
        "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        "containers": [{
            "name": "ctr",
            "image": "busybox:1.37",
            "command": ["sh", "-c", script],
            "resources": {"claims": [{"name": "gpus"}]},
        }],
    });
    match placement {
        PlacedBy::TopologyAware => {
            spec["schedulingGates"] = serde_json::json!([{"name": TOPOLOGY_AWARE_GATE}]);
        }
        PlacedBy::SchedulerOn(node) => {
            spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
        }
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": spec,
    }))
    .context("building a Pod")
}

/// A pod without a claim on `node`, printing what it sees like the claim pods.
pub fn plain_pod(namespace: &str, name: &str, node: &str) -> anyhow::Result<Pod> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "ctr",
                "image": "busybox:1.37",
                "command": ["sh", "-c", PRINT_GPU_ENV],
            }],
        },
    }))
    .context("building a Pod")
}

/// Creates `namespace` (labelled as the suite's).
pub async fn create_namespace(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let object: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("cannot create namespace {namespace}"))?;
    Ok(())
}

/// Creates a claim and a pod using it.
pub async fn create_claim_and_pod(
    client: &kube::Client,
    claim: &ResourceClaim,
    pod: &Pod,
) -> anyhow::Result<()> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), claim)
        .await
        .with_context(|| {
            format!(
                "cannot create ResourceClaim {namespace}/{}",
                claim.metadata.name.as_deref().unwrap_or_default()
            )
        })?;
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), pod)
        .await
        .with_context(|| {
            format!(
                "cannot create pod {namespace}/{}",
                pod.metadata.name.as_deref().unwrap_or_default()
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_pods_are_built_as_the_examples_write_them() {
        let claim = gpu_claim(
            "ns",
            "c",
            4,
            Some("device.attributes[\"gpu.tessera.dev\"].minor == 0"),
        )
        .unwrap();
        let request = &claim
            .spec
            .as_ref()
            .unwrap()
            .devices
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()[0];
        let exactly = request.exactly.as_ref().unwrap();
        assert_eq!(exactly.count, Some(4));
        assert_eq!(exactly.selectors.as_ref().unwrap().len(), 1);

        let mps = serde_json::to_value(mps_claim("ns", "m", 40, "4Gi").unwrap()).unwrap();
        let config = &mps["spec"]["devices"]["config"][0];
        assert_eq!(config["requests"], serde_json::json!(["gpus"]));
        assert_eq!(config["opaque"]["driver"], DRIVER_NAME);
        let sharing = &config["opaque"]["parameters"]["sharing"];
        assert_eq!(sharing["strategy"], "MPS");
        assert_eq!(sharing["mps"]["defaultActiveThreadPercentage"], 40);
        assert_eq!(sharing["mps"]["defaultPinnedDeviceMemoryLimit"], "4Gi");
        let looping =
            gpu_pod_running("ns", "p", "m", PlacedBy::SchedulerOn("n1"), CHECK_EVERY_2S).unwrap();
        let command = looping.spec.unwrap().containers[0].command.clone().unwrap();
        assert_eq!(command[2], CHECK_EVERY_2S);

        let gated = gpu_pod("ns", "p", "c", PlacedBy::TopologyAware).unwrap();
        let spec = gated.spec.unwrap();
        assert_eq!(spec.scheduling_gates.unwrap()[0].name, TOPOLOGY_AWARE_GATE);
        assert!(spec.node_selector.is_none());

        let pinned = gpu_pod("ns", "p", "c", PlacedBy::SchedulerOn("n2")).unwrap();
        let spec = pinned.spec.unwrap();
        assert!(spec.scheduling_gates.is_none());
        assert_eq!(spec.node_selector.unwrap()["kubernetes.io/hostname"], "n2");
        assert_eq!(
            spec.resource_claims.unwrap()[0]
                .resource_claim_name
                .as_deref(),
            Some("c")
        );
    }
}
