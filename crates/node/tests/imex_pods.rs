//! IMEX daemon pods against the API-server fake: the peers of a domain are the nodes of the pods
//! its claim is reserved for (their annotated or internal addresses), a refresh replaces a daemon
//! pod whose domain grew with one naming the new peers and rewrites the nodes config, the node's
//! daemon pods are listed by domain, and stopping deletes the pod and the domain's directory.
//! (Starting waits for a daemon to answer; the e2e scenario `imex` runs that on the local cluster.)

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};
use tessera_fake_apiserver::FakeApiServer;
use tessera_node::imex_pods::{
    ImexPodTemplate, PEERS_ANNOTATION, PodImexControl, daemon_pod, pod_name,
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
