//! What an IMEX daemon pod is, and what it reads (pure): the pod of a (domain, node), the domain's
//! `config.cfg` and nodes config, and the peers' addresses from the claim, its pods and their
//! nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, HostPathVolumeSource, Node, Pod, PodSpec, SecurityContext, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ObjectMeta;
use tessera_api::imex::{ADDRESS_ANNOTATION, CONFIG_DIR_IN_CONTAINER};
use tessera_prepare::imex::{COMMAND_SOCKET, CONFIG_FILE, ImexDomain, NODES_FILE};

/// Where the driver root is mounted in a daemon pod.
pub const DRIVER_ROOT_IN_POD: &str = "/driver-root";
/// Label naming the domain (the channel claim's UID) a daemon pod serves.
pub const DOMAIN_LABEL: &str = "gpu.tessera.dev/imex-domain";
/// Label naming the node a daemon pod runs on (the MPS pods' label).
pub const NODE_LABEL: &str = crate::mps_pods::NODE_LABEL;
/// Annotation naming the channel claim (`namespace/name`), so that a restarted plugin finds the
/// claim of each daemon pod again.
pub const CLAIM_ANNOTATION: &str = "gpu.tessera.dev/imex-claim";
/// Annotation holding the peer addresses the pod's daemon was started with.
pub const PEERS_ANNOTATION: &str = "gpu.tessera.dev/imex-peers";
/// The pods' `app.kubernetes.io/component`.
pub const COMPONENT: &str = "imex-daemon";
/// The port IMEX daemons talk to each other on (the driver's default).
pub const SERVER_PORT: u16 = 50000;

/// What every IMEX daemon pod of this node has in common.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexPodTemplate {
    pub node_name: String,
    /// The plugin's namespace.
    pub namespace: String,
    /// The plugin's image.
    pub image: String,
    pub priority_class: Option<String>,
    /// Privileged (real GPUs: the daemon opens the driver's fabric and channel devices).
    pub privileged: bool,
    /// The driver root on the host.
    pub driver_root: PathBuf,
    /// The device root on the host; mounted at its own path when it is not `/`.
    pub dev_root: PathBuf,
    /// `nvidia-imex` in the driver root.
    pub daemon: PathBuf,
    /// The driver's library directories in the driver root.
    pub library_dirs: Vec<PathBuf>,
}

/// The daemon pod of domain `claim_uid` on node `node`: the pods of all nodes share the plugin's
/// namespace, so the name carries the node (as a short hash: a node name may be 253 characters).
pub fn pod_name(claim_uid: &str, node: &str) -> String {
    // FNV-1a: stable across releases and platforms, unlike the standard library's hasher.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("tessera-imex-{claim_uid}-{:08x}", hash as u32)
}

fn in_pod(path: &Path) -> String {
    Path::new(DRIVER_ROOT_IN_POD)
        .join(path.strip_prefix("/").unwrap_or(path))
        .display()
        .to_string()
}

/// The domain's `config.cfg`: the nodes config and the command socket in the domain's directory
/// as containers see it ([`CONFIG_DIR_IN_CONTAINER`]), this node's address.
pub fn config_text(own_address: &str) -> String {
    format!(
        "# Written by the Tessera node plugin for one IMEX domain; rewritten when its peers change.\n\
         IMEX_NODE_CONFIG_FILE={CONFIG_DIR_IN_CONTAINER}/{NODES_FILE}\n\
         BIND_INTERFACE_IP={own_address}\n\
         SERVER_PORT={SERVER_PORT}\n\
         IMEX_CMD_ENABLED=1\n\
         IMEX_CMD_UNIX_DOMAIN_PATH={CONFIG_DIR_IN_CONTAINER}/{COMMAND_SOCKET}\n"
    )
}

/// The nodes config: one peer address per line, sorted.
pub fn nodes_text(peers: &BTreeSet<String>) -> String {
    peers.iter().map(|p| format!("{p}\n")).collect()
}

/// A node's IMEX address: its annotation, else its first `InternalIP`.
pub fn node_address(node: &Node) -> Option<String> {
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADDRESS_ANNOTATION))
        .filter(|a| !a.is_empty());
    if let Some(address) = annotated {
        return Some(address.clone());
    }
    node.status
        .as_ref()?
        .addresses
        .iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// The pods a claim is reserved for, by name (`reservedFor` entries of resource `pods`).
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| r.name.clone())
        .collect()
}

/// The nodes the domain's bound pods run on, this node included.
pub fn peer_nodes(own_node: &str, pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .filter(|n| !n.is_empty())
        .chain([own_node.to_owned()])
        .collect()
}

/// The pod that runs `domain`'s daemon on this node with `peers` (pure).
pub fn daemon_pod(
    template: &ImexPodTemplate,
    domain: &ImexDomain,
    peers: &BTreeSet<String>,
) -> Pod {
    let (volumes, volume_mounts) = daemon_volumes(template, &domain.directory);
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "tessera".to_owned()),
        (
            "app.kubernetes.io/component".to_owned(),
            COMPONENT.to_owned(),
        ),
        (NODE_LABEL.to_owned(), template.node_name.clone()),
        (DOMAIN_LABEL.to_owned(), domain.claim_uid.clone()),
    ]);
    let annotations = BTreeMap::from([
        (CLAIM_ANNOTATION.to_owned(), domain.claim()),
        (
            PEERS_ANNOTATION.to_owned(),
            peers.iter().cloned().collect::<Vec<_>>().join(","),
        ),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&domain.claim_uid, &template.node_name)),
            namespace: Some(template.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(template.node_name.clone()),
            restart_policy: Some("OnFailure".to_owned()),
            automount_service_account_token: Some(false),
            // Peers reach the daemon at the node's address.
            host_network: Some(true),
            priority_class_name: template.priority_class.clone(),
            termination_grace_period_seconds: Some(10),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            }]),
            containers: vec![daemon_container(template, volume_mounts)],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The pod's one container: the driver root's `nvidia-imex` on the domain's configuration.
fn daemon_container(template: &ImexPodTemplate, volume_mounts: Vec<VolumeMount>) -> Container {
    let libraries: Vec<String> = template.library_dirs.iter().map(|d| in_pod(d)).collect();
    Container {
        name: COMPONENT.to_owned(),
        image: Some(template.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec![in_pod(&template.daemon)]),
        args: Some(vec![
            "-c".to_owned(),
            format!("{CONFIG_DIR_IN_CONTAINER}/{CONFIG_FILE}"),
        ]),
        env: Some(vec![EnvVar {
            name: "LD_LIBRARY_PATH".to_owned(),
            value: Some(libraries.join(":")),
            ..EnvVar::default()
        }]),
        security_context: Some(SecurityContext {
            privileged: Some(template.privileged),
            run_as_user: Some(0),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    }
}

fn host_path(name: &str, path: &Path, mount_at: &str, read_only: bool) -> (Volume, VolumeMount) {
    (
        Volume {
            name: name.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("Directory".to_owned()),
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: name.to_owned(),
            mount_path: mount_at.to_owned(),
            read_only: Some(read_only),
            ..VolumeMount::default()
        },
    )
}

/// The driver root (read-only), the domain's directory at [`CONFIG_DIR_IN_CONTAINER`] (the
/// daemon creates its command socket there) and, when devices live elsewhere than `/dev`, the
/// device root (writable: a fake driver keeps the node's IMEX lock there).
fn daemon_volumes(template: &ImexPodTemplate, directory: &Path) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut mounts = vec![
        host_path(
            "driver-root",
            &template.driver_root,
            DRIVER_ROOT_IN_POD,
            true,
        ),
        host_path("imex", directory, CONFIG_DIR_IN_CONTAINER, false),
    ];
    if template.dev_root != Path::new("/") {
        let at = template.dev_root.display().to_string();
        mounts.push(host_path("dev-root", &template.dev_root, &at, false));
    }
    mounts.into_iter().unzip()
}

/// The peers a daemon pod was started with (its annotation).
pub fn pod_peers(pod: &Pod) -> BTreeSet<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PEERS_ANNOTATION))
        .map(|p| {
            p.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// What prepare says when a host `nvidia-imex` holds the node: what was found and the fix.
pub fn host_daemon_reason(node: &str, address: &std::net::SocketAddr) -> String {
    format!(
        "host nvidia-imex service running on node {node}: {address} (the IMEX port) answers while \
         no Tessera IMEX daemon runs there, and the driver admits one IMEX daemon per node; stop \
         it (systemctl disable --now nvidia-imex) on nodes whose IMEX domains Tessera runs, or \
         keep this node out of them"
    )
}

/// Why a pod will not run, if its status says so.
pub fn broken(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() == Some("Failed") {
        return Some(format!(
            "the pod failed: {}",
            status.message.clone().unwrap_or_default()
        ));
    }
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            matches!(
                w.reason.as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff" | "InvalidImageName")
                    | Some("CreateContainerConfigError" | "CreateContainerError")
                    | Some("CrashLoopBackOff")
            )
        })?;
    Some(format!(
        "{}: {}",
        waiting.reason.clone().unwrap_or_default(),
        waiting.message.clone().unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(dev_root: &str) -> ImexPodTemplate {
        ImexPodTemplate {
            node_name: "tray-1".into(),
            namespace: "tessera-system".into(),
            image: "ghcr.io/tessera-dev/tessera:0.1.0".into(),
            priority_class: Some("system-node-critical".into()),
            privileged: true,
            driver_root: "/run/nvidia/driver".into(),
            dev_root: dev_root.into(),
            daemon: "/usr/bin/nvidia-imex".into(),
            library_dirs: vec!["/usr/lib/x86_64-linux-gnu".into()],
        }
    }

    fn domain() -> ImexDomain {
        ImexDomain {
            claim_uid: "4f7c2a10-0000-4000-8000-00000000000a".into(),
            namespace: "ml".into(),
            name: "domain".into(),
            channel: 3,
            clique: "c.1".into(),
            directory: "/var/lib/tessera/imex/4f7c2a10-0000-4000-8000-00000000000a".into(),
        }
    }

    #[test]
    fn the_pod_runs_the_drivers_daemon_on_the_domains_configuration_on_the_host_network() {
        let peers = BTreeSet::from(["10.0.0.2".to_owned(), "10.0.0.1".to_owned()]);
        let json =
            serde_json::to_value(daemon_pod(&template("/mock/dev"), &domain(), &peers)).unwrap();
        let name = json["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            name,
            "tessera-imex-4f7c2a10-0000-4000-8000-00000000000a-1b188f83"
        );
        assert_eq!(
            name,
            pod_name("4f7c2a10-0000-4000-8000-00000000000a", "tray-1")
        );
        assert_ne!(
            pod_name("4f7c2a10-0000-4000-8000-00000000000a", "tray-2"),
            name,
            "one pod per domain and node, in one namespace"
        );
        assert_eq!(
            json["metadata"]["labels"][DOMAIN_LABEL],
            "4f7c2a10-0000-4000-8000-00000000000a"
        );
        assert_eq!(json["metadata"]["labels"][NODE_LABEL], "tray-1");
        assert_eq!(
            json["metadata"]["annotations"][CLAIM_ANNOTATION],
            "ml/domain"
        );
        assert_eq!(
            json["metadata"]["annotations"][PEERS_ANNOTATION],
            "10.0.0.1,10.0.0.2"
        );
        assert_eq!(json["spec"]["nodeName"], "tray-1");
        assert_eq!(json["spec"]["hostNetwork"], true);
        let container = &json["spec"]["containers"][0];
        assert_eq!(
            container["command"],
            json!(["/driver-root/usr/bin/nvidia-imex"])
        );
        assert_eq!(
            container["args"],
            json!(["-c", "/etc/nvidia-imex/config.cfg"])
        );
        assert_eq!(
            container["env"][0]["value"],
            "/driver-root/usr/lib/x86_64-linux-gnu"
        );
        let mounts: Vec<(&str, bool)> = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["mountPath"].as_str().unwrap(),
                    m["readOnly"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            [
                ("/driver-root", true),
                ("/etc/nvidia-imex", false),
                ("/mock/dev", false)
            ]
        );
        assert_eq!(
            json["spec"]["volumes"][1]["hostPath"]["path"],
            "/var/lib/tessera/imex/4f7c2a10-0000-4000-8000-00000000000a"
        );
        let pod = daemon_pod(&template("/"), &domain(), &peers);
        assert_eq!(
            pod.spec.as_ref().unwrap().volumes.as_ref().unwrap().len(),
            2
        );
        assert_eq!(pod_peers(&pod), peers);
    }

    #[test]
    fn the_configuration_names_the_peers_and_the_socket_containers_see() {
        assert_eq!(
            config_text("10.0.0.1")
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            [
                "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg",
                "BIND_INTERFACE_IP=10.0.0.1",
                "SERVER_PORT=50000",
                "IMEX_CMD_ENABLED=1",
                "IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/cmd.sock",
            ]
        );
        let peers = BTreeSet::from(["10.0.0.2".to_owned(), "10.0.0.1".to_owned()]);
        assert_eq!(nodes_text(&peers), "10.0.0.1\n10.0.0.2\n");
    }

    #[test]
    fn peers_are_the_nodes_of_the_claims_bound_pods_and_their_addresses() {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "domain", "namespace": "ml"},
            "spec": {},
            "status": {"reservedFor": [
                {"resource": "pods", "name": "job-0", "uid": "a"},
                {"resource": "pods", "name": "job-1", "uid": "b"},
                {"resource": "jobs", "apiGroup": "batch", "name": "job", "uid": "c"},
            ]},
        }))
        .unwrap();
        assert_eq!(reserved_pods(&claim), ["job-0", "job-1"]);
        let pod = |node: Option<&str>| -> Pod {
            serde_json::from_value(
                json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": node}}),
            )
            .unwrap()
        };
        assert_eq!(
            peer_nodes(
                "tray-1",
                &[pod(Some("tray-2")), pod(None), pod(Some("tray-1"))]
            ),
            BTreeSet::from(["tray-1".to_owned(), "tray-2".to_owned()])
        );
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "tray-1"},
            "status": {"addresses": [{"type": "Hostname", "address": "tray-1"},
                {"type": "InternalIP", "address": "10.0.0.1"}]}}))
        .unwrap();
        assert_eq!(node_address(&node).as_deref(), Some("10.0.0.1"));
        let mut annotated = node.clone();
        annotated.metadata.annotations = Some(BTreeMap::from([(
            ADDRESS_ANNOTATION.to_owned(),
            "192.168.7.1".to_owned(),
        )]));
        assert_eq!(node_address(&annotated).as_deref(), Some("192.168.7.1"));
    }
}
