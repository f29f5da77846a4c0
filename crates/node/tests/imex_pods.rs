//! IMEX daemon pods against the API-server fake: the peers of a domain are the nodes of the pods
//! its claim is reserved for (their annotated or internal addresses), a refresh replaces a daemon
//! pod whose domain grew with one naming the new peers and rewrites the nodes config, the node's
//! daemon pods are listed by domain, and stopping deletes the pod and the domain's directory.
//! A node's daemon health is its own condition on the domain's claim, with an Event per change,
//! and a daemon pod that cannot run fails prepare and marks the claim. (Starting a daemon that
//! answers, and several nodes' conditions merged on one claim by the API server, are the e2e
//! scenario `imex`'s, on the local cluster.)

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use tessera_fake_apiserver::{FakeApiServer, Verb};
use tessera_node::imex_pods::condition::{DaemonHealth, NOT_READY_REASON, READY_REASON};
use tessera_node::imex_pods::{
    DomainConditions, ImexPodTemplate, PEERS_ANNOTATION, PodImexControl, daemon_pod, pod_name,
};
use tessera_prepare::imex::{ImexControl, ImexDomain};

const UID: &str = "4f7c2a10-0000-4000-8000-00000000000a";

fn seed(server: &FakeApiServer) {
    for namespace in ["ml", "tessera-system"] {
        server.seed_json(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        );
    }
    server.seed_json(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tray-1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
    );
    server.seed_json(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "tray-2", "annotations": {"gpu.tessera.dev/imex-address": "192.168.7.2"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]}}));
    server.seed_json(claim(&["job-0"]));
    server.seed_json(job_pod("job-0", Some("tray-1")));
}

fn claim(pods: &[&str]) -> Value {
    let reserved: Vec<Value> = pods
        .iter()
        .map(|p| json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ml", "name": "domain", "uid": UID},
        "spec": {"devices": {"requests": []}},
        "status": {"reservedFor": reserved}})
}

fn job_pod(name: &str, node: Option<&str>) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
}

fn template() -> ImexPodTemplate {
    ImexPodTemplate {
        node_name: "tray-1".into(),
        namespace: "tessera-system".into(),
        image: "tessera:test".into(),
        priority_class: None,
        privileged: false,
        driver_root: "/driver".into(),
        dev_root: "/".into(),
        daemon: "/usr/bin/nvidia-imex".into(),
        library_dirs: vec![],
    }
}

fn domain(imex_root: &Path) -> ImexDomain {
    ImexDomain {
        claim_uid: UID.into(),
        namespace: "ml".into(),
        name: "domain".into(),
        channel: 3,
        clique: "c.1".into(),
        directory: imex_root.join(UID),
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn peers_of_daemon_pod(server: &FakeApiServer) -> Option<String> {
    let pod = server.get_json("pods", Some("tessera-system"), &pod_name(UID, "tray-1"))?;
    pod["metadata"]["annotations"][PEERS_ANNOTATION]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domains_daemon_follows_its_pods_nodes_and_stops_with_its_directory() {
    let server = FakeApiServer::new();
    seed(&server);
    let dir = tempfile::tempdir().unwrap();
    let imex_root = dir.path().join("imex");
    let control = PodImexControl::new(
        server.client(),
        tokio::runtime::Handle::current(),
        template(),
        imex_root.clone(),
        "/nonexistent/nvidia-imex-ctl".into(),
        String::new(),
    );
    let blocking = |f: Box<dyn FnOnce(&PodImexControl) -> Value + Send>| {
        let control = control.clone();
        tokio::task::spawn_blocking(move || f(&control))
    };

    // The domain has one bound pod, on this node: its peers are this node alone.
    let peers = blocking(Box::new(|c| json!(c.peers("ml", "domain").unwrap())))
        .await
        .unwrap();
    assert_eq!(peers, json!(["10.0.0.1"]));

    // Its daemon pod as start made it, then a second pod bound on tray-2 (an annotated address)
    // and a third not bound yet.
    let the_domain = domain(&imex_root);
    std::fs::create_dir_all(&the_domain.directory).unwrap();
    server.seed(&daemon_pod(&template(), &the_domain, &set(&["10.0.0.1"])));
    server.seed_json(job_pod("job-1", Some("tray-2")));
    server.seed_json(job_pod("job-2", None));
    server.seed_json(claim(&["job-0", "job-1", "job-2"]));
    let restarted = blocking(Box::new(|c| json!(c.refresh()))).await.unwrap();
    assert_eq!(restarted, json!([UID]));
    assert_eq!(
        peers_of_daemon_pod(&server).as_deref(),
        Some("10.0.0.1,192.168.7.2")
    );
    let nodes = std::fs::read_to_string(the_domain.directory.join("nodes_config.cfg")).unwrap();
    assert_eq!(nodes, "10.0.0.1\n192.168.7.2\n");
    let config = std::fs::read_to_string(the_domain.directory.join("config.cfg")).unwrap();
    assert!(config.contains("BIND_INTERFACE_IP=10.0.0.1\n"), "{config}");
    let again = blocking(Box::new(|c| json!(c.refresh()))).await.unwrap();
    assert_eq!(again, json!([]), "unchanged peers restart nothing");

    let domains = blocking(Box::new(|c| {
        json!(
            c.domains()
                .unwrap()
                .iter()
                .map(|u| u.to_string())
                .collect::<Vec<_>>()
        )
    }))
    .await
    .unwrap();
    assert_eq!(domains, json!([UID]));

    let directory = the_domain.directory.clone();
    let stopped = blocking(Box::new(move |c| json!(c.stop(UID, &directory).is_ok())))
        .await
        .unwrap();
    assert_eq!(stopped, json!(true));
    assert_eq!(
        server.get_json("pods", Some("tessera-system"), &pod_name(UID, "tray-1")),
        None
    );
    assert!(!the_domain.directory.exists());
    let directory = the_domain.directory.clone();
    let again = blocking(Box::new(move |c| json!(c.stop(UID, &directory).is_ok())))
        .await
        .unwrap();
    assert_eq!(again, json!(true), "stopping a stopped domain succeeds");
}

/// The domain claim `domain` reserved for `job-0`, allocated channel 3 of clique `c.1`.
fn allocated_domain() -> Value {
    let mut claim = claim(&["job-0"]);
    claim["status"]["allocation"] = json!({"devices": {"results": [{"request": "channel",
        "driver": "gpu.tessera.dev", "pool": "imex-c.1", "device": "channel-3"}]}});
    claim
}

/// This node's condition on the domain's channel entry: (status, reason, message).
fn node_condition(server: &FakeApiServer, node: &str) -> Option<(String, String, String)> {
    let claim = server.get_json("resourceclaims", Some("ml"), "domain")?;
    let devices = claim["status"]["devices"].as_array()?;
    let entry = devices
        .iter()
        .find(|d| d["pool"] == json!("imex-c.1") && d["device"] == json!("channel-3"))?;
    let condition = entry["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == json!(format!("{node}/IMEXDaemonReady")))?;
    let text = |key: &str| condition[key].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// The field managers of the domain's claim.
fn claim_managers(server: &FakeApiServer) -> Vec<String> {
    let claim = server
        .get_json("resourceclaims", Some("ml"), "domain")
        .unwrap();
    claim["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(str::to_owned))
        .collect()
}

/// The Events on the domain's claim: (type, reason, note).
fn claim_events(server: &FakeApiServer) -> Vec<(String, String, String)> {
    server
        .list_json("events.events.k8s.io", Some("ml"))
        .iter()
        .filter(|e| e["regarding"]["name"] == json!("domain"))
        .map(|e| {
            let text = |key: &str| e[key].as_str().unwrap_or_default().to_owned();
            (text("type"), text("reason"), text("note"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_daemon_health_is_its_own_condition_on_the_claim_with_an_event_per_change() {
    let server = FakeApiServer::new();
    seed(&server);
    server.seed_json(allocated_domain());
    let claim: ResourceClaim = server.get(Some("ml"), "domain").unwrap();
    let conditions = DomainConditions::new(server.client(), "tray-4");
    let failing = DaemonHealth::NotReady("UNAVAILABLE link down".into());

    conditions.report(&claim, &failing).await.unwrap();
    assert_eq!(
        node_condition(&server, "tray-4"),
        Some((
            "False".into(),
            NOT_READY_REASON.into(),
            "UNAVAILABLE link down".into()
        ))
    );
    let applies = server.request_count(Verb::Apply, "resourceclaims/status");
    assert_eq!(applies, 1);
    let managers = claim_managers(&server);
    assert!(
        managers.iter().any(|m| m == "tessera-imex/tray-4"),
        "{managers:?}"
    );
    let events = claim_events(&server);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Warning", NOT_READY_REASON)
    );
    assert!(
        events[0].2.contains("node tray-4") && events[0].2.contains("link down"),
        "{events:?}"
    );

    // The same state again writes nothing and records nothing.
    conditions.report(&claim, &failing).await.unwrap();
    let applies_after = server.request_count(Verb::Apply, "resourceclaims/status");
    assert_eq!(applies_after, applies);
    assert_eq!(claim_events(&server).len(), 1);

    // Recovery: True, and a Normal Event.
    conditions
        .report(&claim, &DaemonHealth::Ready)
        .await
        .unwrap();
    assert_eq!(
        node_condition(&server, "tray-4").map(|c| (c.0, c.1)),
        Some(("True".into(), READY_REASON.into()))
    );
    let events = claim_events(&server);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        (events[1].0.as_str(), events[1].1.as_str()),
        ("Normal", READY_REASON)
    );

    // After a restart the claim's own condition is the previous state: nothing to write.
    let restarted = DomainConditions::new(server.client(), "tray-4");
    let claim: ResourceClaim = server.get(Some("ml"), "domain").unwrap();
    server.clear_requests();
    restarted
        .report(&claim, &DaemonHealth::Ready)
        .await
        .unwrap();
    assert_eq!(
        server.request_count(Verb::Apply, "resourceclaims/status"),
        0
    );

    // The domain leaves the node: its condition goes; a claim gone is no error.
    assert!(restarted.forget("ml", "domain", UID).await.unwrap());
    assert_eq!(node_condition(&server, "tray-4"), None);
    assert!(restarted.forget("ml", "gone", "0000").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_undone_keeps_its_condition_and_the_retry_records_no_second_event() {
    let server = FakeApiServer::new();
    seed(&server);
    server.seed_json(allocated_domain());
    let conditions = DomainConditions::new(server.client(), "tray-4");
    let failing = DaemonHealth::NotReady("UNAVAILABLE link down".into());
    let claim: ResourceClaim = server.get(Some("ml"), "domain").unwrap();
    conditions.report(&claim, &failing).await.unwrap();
    assert!(!conditions.forget("ml", "domain", UID).await.unwrap());
    let claim: ResourceClaim = server.get(Some("ml"), "domain").unwrap();
    conditions.report(&claim, &failing).await.unwrap();
    assert_eq!(
        node_condition(&server, "tray-4").map(|c| c.0),
        Some("False".to_owned())
    );
    let warnings = claim_events(&server)
        .iter()
        .filter(|e| e.1 == NOT_READY_REASON)
        .count();
    assert_eq!(warnings, 1, "one for the failure, none for the retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_pod_that_cannot_run_fails_prepare_and_marks_the_claim() {
    let server = FakeApiServer::new();
    seed(&server);
    server.seed_json(allocated_domain());
    let dir = tempfile::tempdir().unwrap();
    let imex_root = dir.path().join("imex");
    let the_domain = domain(&imex_root);
    let mut pod =
        serde_json::to_value(daemon_pod(&template(), &the_domain, &set(&["10.0.0.1"]))).unwrap();
    pod["status"] = json!({"phase": "Pending", "containerStatuses": [{"name": "imex",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "host nvidia-imex holds the fabric"}}}]});
    server.seed_json(pod);
    let control = PodImexControl::new(
        server.client(),
        tokio::runtime::Handle::current(),
        template(),
        imex_root.clone(),
        "/nonexistent/nvidia-imex-ctl".into(),
        String::new(),
    );
    let started = tokio::task::spawn_blocking(move || control.start(&the_domain))
        .await
        .unwrap();
    let error = started.unwrap_err().to_string();
    assert!(error.contains("CrashLoopBackOff"), "{error}");
    let (status, reason, message) = node_condition(&server, "tray-1").expect("a condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", NOT_READY_REASON)
    );
    assert!(
        message.contains("host nvidia-imex holds the fabric"),
        "{message}"
    );
    let events = claim_events(&server);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, NOT_READY_REASON);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_nvidia_imex_holding_the_port_is_reported_and_no_daemon_pod_is_started() {
    let server = FakeApiServer::new();
    seed(&server);
    server.seed_json(allocated_domain());
    // This node's IMEX address is loopback here, and something listens on its IMEX port: what a
    // host nvidia-imex service looks like from the plugin.
    server.seed_json(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "tray-1",
        "annotations": {"gpu.tessera.dev/imex-address": "127.0.0.1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
    );
    let host_daemon = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host_daemon.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let imex_root = dir.path().join("imex");
    let the_domain = domain(&imex_root);
    let control = PodImexControl::new(
        server.client(),
        tokio::runtime::Handle::current(),
        template(),
        imex_root.clone(),
        "/nonexistent/nvidia-imex-ctl".into(),
        String::new(),
    )
    .with_server_port(port);
    let started = tokio::task::spawn_blocking(move || control.start(&the_domain))
        .await
        .unwrap();
    let error = started.unwrap_err().to_string();
    assert!(
        error.contains("host nvidia-imex service running on node tray-1")
            && error.contains(&format!("127.0.0.1:{port}"))
            && error.contains("systemctl disable --now nvidia-imex"),
        "{error}"
    );
    assert_eq!(
        server.get_json("pods", Some("tessera-system"), &pod_name(UID, "tray-1")),
        None,
        "no daemon pod started against it"
    );
    let (status, _, message) = node_condition(&server, "tray-1").expect("a condition");
    assert_eq!(status, "False");
    assert!(
        message.contains("host nvidia-imex service running"),
        "{message}"
    );
    drop(host_daemon);
}
