//! `tessera explain --pod` and tessera-controller make the same decision: the same objects go
//! through the `tessera` binary (written to files) and through the controller running against the
//! API-server fake, and both must name the same node and devices for every claim — or both leave
//! the pod to kube-scheduler — on topology-managed nodes, unmanaged nodes and a mix of both.

use tessera_controller_harness as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::Value;
use tessera_fake_apiserver::FakeApiServer;

use support::harness::{claim, cluster, event, placement, released, start};
use support::*;

/// `claim -> (node, devices)`, or `None` when the pod is left to the scheduler unallocated.
type Verdict = Option<BTreeMap<String, (String, Vec<String>)>>;

/// Every object the controller would watch, written to `dir/objects.yaml`.
fn write_objects(api: &FakeApiServer, dir: &Path) {
    let mut documents: Vec<Value> = Vec::new();
    fn add<K: serde::Serialize>(documents: &mut Vec<Value>, objects: Vec<K>) {
        documents.extend(objects.iter().map(|o| serde_json::to_value(o).unwrap()));
    }
    add(&mut documents, api.list::<ResourceSlice>(None));
    add(&mut documents, api.list::<DeviceClass>(None));
    add(&mut documents, api.list::<ResourceClaim>(None));
    add(&mut documents, api.list::<ResourceClaimTemplate>(None));
    add(&mut documents, api.list::<Node>(None));
    add(&mut documents, api.list::<Pod>(None));
    let text: Vec<String> = documents
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(dir.join("objects.yaml"), text.join("---\n")).unwrap();
}

/// `value` without `allocationTimestamp`s (each run decides at its own time).
fn without_timestamps(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("allocationTimestamp");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

/// Runs `command`, requires success and returns its JSON output.
fn json_of(command: &mut Command) -> Value {
    let out = command.output().expect("the tessera binary runs");
    assert!(
        out.status.success(),
        "tessera explain failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// What `tessera explain --pod` says the controller does, from the objects written to files; and
/// `kubectl tessera explain pod/NAME` (the binary started as `kubectl-tessera`) reading the same
/// objects from the API server through a kubeconfig must say exactly the same.
async fn explained(api: &FakeApiServer, pod: &str) -> (Value, Verdict) {
    let dir = tempfile::tempdir().unwrap();
    write_objects(api, dir.path());
    let report = json_of(
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["explain", "--objects"])
            .arg(dir.path())
            .args(["--pod", &format!("{NS}/{pod}"), "-o", "json"]),
    );
    let server = api.serve_http().await.expect("the fake serves HTTP");
    let plugin = dir.path().join("kubectl-tessera");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tessera"), &plugin).unwrap();
    let kubeconfig = server.kubeconfig_path().to_owned();
    let target = format!("pod/{pod}");
    let live = tokio::task::spawn_blocking(move || {
        json_of(
            Command::new(plugin)
                .args(["explain", &target, "-n", NS, "-o", "json", "--kubeconfig"])
                .arg(kubeconfig),
        )
    })
    .await
    .unwrap();
    assert_eq!(
        without_timestamps(live),
        without_timestamps(report.clone()),
        "explain on the live cluster and on its objects as files disagree"
    );
    let verdict = match report["action"].as_str() {
        Some("Place") => Some(
            report["claims"]
                .as_array()
                .expect("claims")
                .iter()
                .map(|c| {
                    let results = c["allocation"]["devices"]["results"]
                        .as_array()
                        .expect("results");
                    let node = results[0]["pool"].as_str().unwrap().to_owned();
                    let devices = results
                        .iter()
                        .map(|r| r["device"].as_str().unwrap().to_owned())
                        .collect();
                    let claim = c["claim"].as_str().unwrap();
                    (
                        claim.rsplit('/').next().unwrap().to_owned(),
                        (node, devices),
                    )
                })
                .collect(),
        ),
        Some("LeaveToScheduler") => None,
        other => panic!("explain decided {other:?}, not a placement: {report:#}"),
    };
    (report, verdict)
}

/// What the controller did with the pod's `claims`.
async fn controlled(api: &FakeApiServer, pod: &str, claims: &[&str]) -> Verdict {
    let controller = start(api);
    released(api, pod).await;
    let placed: BTreeMap<String, (String, Vec<String>)> = claims
        .iter()
        .filter_map(|c| placement(&claim(api, c)).map(|p| ((*c).to_owned(), p)))
        .collect();
    let verdict = if placed.is_empty() {
        event(api, pod, "LeftToScheduler").await;
        None
    } else {
        Some(placed)
    };
    controller.stop().await;
    verdict
}

/// Runs `pod` (with `claims`) through both and requires the same verdict; returns it.
async fn agree(api: &FakeApiServer, pod: &str, claims: &[&str]) -> Verdict {
    let (report, explained) = explained(api, pod).await;
    let controlled = controlled(api, pod, claims).await;
    assert_eq!(
        explained, controlled,
        "explain and the controller disagree; explain said {report:#}"
    );
    controlled
}

fn gpus(node: &str, devices: &[u32]) -> (String, Vec<String>) {
    (
        node.to_owned(),
        devices.iter().map(|d| format!("gpu-{d}")).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_managed_nodes_explain_names_the_controllers_node_and_devices() {
    let api = cluster(2, 0);
    api.seed(&allocated(
        gpu_claim("taken", 4),
        "dgx-0",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ));
    api.seed(&allocated(gpu_claim("also-taken", 1), "dgx-1", &["gpu-0"]));
    api.seed(&gpu_claim("a", 2));
    api.seed(&gpu_claim("b", 2));
    api.seed(&gated_pod(
        "trainer",
        &[
            ("first", Source::Claim("a")),
            ("second", Source::Claim("b")),
        ],
    ));
    let verdict = agree(&api, "trainer", &["a", "b"]).await.expect("placed");
    // Both claims on one node, the free NUMA half of dgx-0 holding all four GPUs.
    let nodes: Vec<&str> = verdict.values().map(|(n, _)| n.as_str()).collect();
    assert_eq!(nodes, ["dgx-0", "dgx-0"], "{verdict:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_managed_and_unmanaged_nodes_both_pick_the_managed_devices() {
    // Before explain called the controller's decision it saw the managed devices' taint as
    // untolerated and placed the claim on the plain node: the controller never does.
    let api = cluster(1, 1);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    let verdict = agree(&api, "trainer", &["a"]).await.expect("placed");
    assert_eq!(verdict["a"], gpus("dgx-0", &[0, 1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_unmanaged_nodes_both_leave_the_pod_to_the_scheduler() {
    let api = cluster(0, 2);
    api.seed(&gpu_claim("a", 2));
    api.seed(&gated_pod("trainer", &[("gpus", Source::Claim("a"))]));
    assert_eq!(agree(&api, "trainer", &["a"]).await, None);
}
