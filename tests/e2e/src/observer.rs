//! The runtime observer: what reached the container runtime, seen the only way each kind of
//! cluster allows.
//!
//! - Local cluster (tests/cluster): the node plugin's CDI specs and checkpoint are files on this
//!   machine (host paths of the chart's pods, or the processes' own), so preparation and
//!   unpreparation are checked directly. With containerd the containers really run and print
//!   what they got: the suite reads their logs, as on kind. With the fake runtime its records
//!   name, per container, the CDI device ids the kubelet passed, which the suite resolves like a
//!   runtime.
//! - kind: containerd applied the CDI specs inside the node; the example containers print their
//!   GPU environment, which the suite reads from the container's log. The plugin's files are
//!   inside the node container, so preparation state is not observable (said so, not faked).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use serde::Deserialize;

use crate::cdi_view::SpecDirectory;
use crate::checker;
use crate::local::{Install, LocalCluster, tail, tail_matching};

/// What one container received.
#[derive(Debug, Clone)]
pub struct ContainerView {
    /// The CDI device ids the runtime got (local cluster only).
    pub cdi_ids: Option<Vec<String>>,
    /// The GPU environment the container ends up with.
    pub env: BTreeMap<String, String>,
    /// The in-container checker's report, when the container ran it (real runtime only).
    pub check: Option<checker::CheckerReport>,
    /// Where this was seen, for messages.
    pub source: String,
}

/// What the node plugin holds for a claim on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOnNode {
    /// Local cluster: spec files defining the claim's devices, and its checkpoint state.
    Seen {
        spec_files: Vec<String>,
        checkpoint_state: Option<String>,
    },
    /// Not observable on this cluster, with the reason.
    Unobservable(String),
}

impl ClaimOnNode {
    /// Nothing left on the node (or not observable).
    pub fn is_gone(&self) -> bool {
        match self {
            ClaimOnNode::Seen {
                spec_files,
                checkpoint_state,
            } => spec_files.is_empty() && checkpoint_state.is_none(),
            ClaimOnNode::Unobservable(_) => true,
        }
    }

    /// Prepared: a spec and a `PrepareCompleted` checkpoint entry (or not observable).
    pub fn is_prepared(&self) -> bool {
        match self {
            ClaimOnNode::Seen {
                spec_files,
                checkpoint_state,
            } => !spec_files.is_empty() && checkpoint_state.as_deref() == Some("PrepareCompleted"),
            ClaimOnNode::Unobservable(_) => true,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            ClaimOnNode::Seen {
                spec_files,
                checkpoint_state,
            } => format!(
                "CDI spec files: {}; checkpoint: {}",
                if spec_files.is_empty() {
                    "none".to_owned()
                } else {
                    spec_files.join(", ")
                },
                checkpoint_state.as_deref().unwrap_or("no entry")
            ),
            ClaimOnNode::Unobservable(why) => format!("not observable: {why}"),
        }
    }
}

/// The observer for the cluster the suite runs against.
pub enum RuntimeObserver {
    Local {
        local: LocalCluster,
        client: kube::Client,
    },
    Kind {
        client: kube::Client,
        /// Namespace of the chart (plugin and controller pods), for log tails.
        namespace: String,
    },
}

/// The fields of a fake CRI container record the suite reads (tests/cluster/README.md).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerRecord {
    #[serde(rename = "podUID")]
    pod_uid: String,
    cdi_devices: Vec<String>,
}

impl RuntimeObserver {
    /// What `container` of `pod` received; `None` while the runtime has not seen it yet.
    pub async fn container_view(
        &self,
        pod: &Pod,
        container: &str,
    ) -> anyhow::Result<Option<ContainerView>> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        match self {
            RuntimeObserver::Local { local, client } => {
                let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                    return Ok(None);
                };
                let node = local.node(node_name)?;
                let Some(record_dir) = &node.cdi_record_dir else {
                    return view_from_log(client, pod, container).await;
                };
                let path = record_dir.join(format!("{namespace}_{name}_{container}.json"));
                let Some(record) = read_record(&path)? else {
                    return Ok(None);
                };
                // A record left by an earlier pod of the same name is not this pod's.
                if Some(record.pod_uid.as_str()) != pod.metadata.uid.as_deref() {
                    return Ok(None);
                }
                let specs = SpecDirectory::read(&node.cdi_spec_dir)?;
                let env = specs.environment(&record.cdi_devices).with_context(|| {
                    format!(
                        "the runtime got CDI ids {:?} for {namespace}/{name}/{container} ({}), but {} does not resolve them",
                        record.cdi_devices,
                        path.display(),
                        node.cdi_spec_dir.display()
                    )
                })?;
                Ok(Some(ContainerView {
                    cdi_ids: Some(record.cdi_devices),
                    env,
                    check: None,
                    source: format!("fake CRI record {}", path.display()),
                }))
            }
            RuntimeObserver::Kind { client, .. } => view_from_log(client, pod, container).await,
        }
    }

    /// What the plugin on `node` holds for the claim with `claim_uid`.
    pub fn claim_on_node(&self, node: &str, claim_uid: &str) -> anyhow::Result<ClaimOnNode> {
        match self {
            RuntimeObserver::Local { local, .. } => {
                let node_dir = local.node(node)?;
                let specs = SpecDirectory::read(&node_dir.cdi_spec_dir)?;
                let spec_files = specs
                    .files_with_device_prefix(&format!("{claim_uid}-"))
                    .into_iter()
                    .map(|p| p.display().to_string())
                    .collect();
                let state_dir = node_dir.plugin_state_dir.as_deref().or(node_dir
                    .plugin
                    .as_ref()
                    .and_then(|p| p.state_dir.as_deref()));
                let checkpoint_state = match state_dir {
                    Some(dir) => checkpoint_state(&dir.join("checkpoint.json"), claim_uid)?,
                    None => None,
                };
                Ok(ClaimOnNode::Seen {
                    spec_files,
                    checkpoint_state,
                })
            }
            RuntimeObserver::Kind { .. } => Ok(ClaimOnNode::Unobservable(
                "on kind the plugin's CDI specs and checkpoint are inside the node container"
                    .to_owned(),
            )),
        }
    }

    /// Tails of the Tessera logs, for failure reports; locally also the kubelet, scheduler and
    /// controller-manager lines that mention one of `namespaces` (their logs are mostly noise).
    pub async fn log_tails(&self, lines: usize, namespaces: &[String]) -> Vec<(String, String)> {
        match self {
            RuntimeObserver::Local { local, client } => {
                let mut out: Vec<(String, String)> = match &local.install {
                    Install::Helm { namespace } => pod_log_tails(client, namespace, lines).await,
                    Install::Processes => local
                        .tessera_logs()
                        .into_iter()
                        .map(|(name, path)| {
                            (format!("{name} ({})", path.display()), tail(&path, lines))
                        })
                        .collect(),
                };
                let mentions = |line: &str| namespaces.iter().any(|ns| line.contains(ns.as_str()));
                let cluster_logs = local
                    .nodes
                    .values()
                    .map(|n| (format!("kubelet of {}", n.name), n.kubelet_log.clone()))
                    .chain(local.control_plane_logs());
                for (name, path) in cluster_logs {
                    let text = tail_matching(&path, lines / 2, mentions);
                    if !text.is_empty() {
                        out.push((
                            format!(
                                "{name}, lines about the scenario's namespaces ({})",
                                path.display()
                            ),
                            text,
                        ));
                    }
                }
                out
            }
            RuntimeObserver::Kind { client, namespace } => {
                pod_log_tails(client, namespace, lines).await
            }
        }
    }

    /// Whether claim containers run the checker against a (fake) driver: the local cluster
    /// with containerd and a fake driver root on every node.
    pub fn expects_checker(&self) -> bool {
        match self {
            RuntimeObserver::Local { local, .. } => {
                local.has_fake_drivers() && local.nodes.values().all(|n| n.cdi_record_dir.is_none())
            }
            RuntimeObserver::Kind { .. } => false,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, RuntimeObserver::Local { .. })
    }

    /// The local cluster, when the suite runs against it.
    pub fn local(&self) -> Option<&LocalCluster> {
        match self {
            RuntimeObserver::Local { local, .. } => Some(local),
            RuntimeObserver::Kind { .. } => None,
        }
    }
}

/// What a container printed (the examples print their GPU environment); `None` until it has
/// started and printed something.
async fn view_from_log(
    client: &kube::Client,
    pod: &Pod,
    container: &str,
) -> anyhow::Result<Option<ContainerView>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let params = LogParams {
        container: Some(container.to_owned()),
        ..LogParams::default()
    };
    let logs = match Api::<Pod>::namespaced(client.clone(), namespace)
        .logs(name, &params)
        .await
    {
        Ok(logs) => logs,
        // Not started yet.
        Err(kube::Error::Api(status)) if status.code == 400 => return Ok(None),
        Err(error) => return Err(error).context("cannot read the container's log"),
    };
    let env = parse_printed_env(&logs);
    let check = checker::find_report(&logs)
        .transpose()
        .with_context(|| format!("log of {namespace}/{name}/{container}"))?;
    if env.is_empty() && check.is_none() {
        return Ok(None);
    }
    Ok(Some(ContainerView {
        cdi_ids: None,
        env,
        check,
        source: format!("log of {namespace}/{name}/{container}"),
    }))
}

/// The last `lines` lines of every pod's log in `namespace` (the chart's pods).
async fn pod_log_tails(
    client: &kube::Client,
    namespace: &str,
    lines: usize,
) -> Vec<(String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return vec![(namespace.to_owned(), "cannot list pods".to_owned())];
    };
    let mut out = Vec::new();
    for pod in list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let params = LogParams {
            tail_lines: Some(lines as i64),
            ..LogParams::default()
        };
        let text = pods
            .logs(&name, &params)
            .await
            .unwrap_or_else(|e| format!("cannot read the log: {e}"));
        out.push((format!("{namespace}/{name}"), text));
    }
    out
}

fn read_record(path: &Path) -> anyhow::Result<Option<ContainerRecord>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("{} is not a fake CRI container record", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The state of `claim_uid` in the plugin's checkpoint file (`None`: no entry or no file).
fn checkpoint_state(path: &Path, claim_uid: &str) -> anyhow::Result<Option<String>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("the checkpoint {} is not JSON", path.display()))?;
    let claims = value
        .pointer("/checkpoint/claims")
        .with_context(|| format!("the checkpoint {} has no checkpoint.claims", path.display()))?;
    Ok(claims.get(claim_uid).map(|c| {
        c.get("state")
            .and_then(|s| s.as_str())
            .unwrap_or("<no state>")
            .to_owned()
    }))
}

/// `NAME=value` lines of a container's output (what the examples print), later lines winning.
pub fn parse_printed_env(log: &str) -> BTreeMap<String, String> {
    log.lines()
        .filter_map(|line| line.trim().split_once('='))
        .filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_env_is_parsed_and_noise_ignored() {
        let log =
            "CUDA_VISIBLE_DEVICES=GPU-a\nNVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b\nsome text\nlower=x\n";
        let env = parse_printed_env(log);
        assert_eq!(env.len(), 2);
        assert_eq!(env["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    }

    #[test]
    fn checkpoint_entries_are_found_by_uid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        assert_eq!(checkpoint_state(&path, "u1").unwrap(), None);
        std::fs::write(
            &path,
            r#"{"version":1,"checksum":"x","checkpoint":{"bootId":"b","claims":{"u1":{"state":"PrepareCompleted"}}}}"#,
        )
        .unwrap();
        assert_eq!(
            checkpoint_state(&path, "u1").unwrap().as_deref(),
            Some("PrepareCompleted")
        );
        assert_eq!(checkpoint_state(&path, "u2").unwrap(), None);
        std::fs::write(&path, "{}").unwrap();
        assert!(checkpoint_state(&path, "u1").is_err());
    }

    #[test]
    fn claim_states_say_what_they_saw() {
        let gone = ClaimOnNode::Seen {
            spec_files: vec![],
            checkpoint_state: None,
        };
        assert!(gone.is_gone() && !gone.is_prepared());
        let prepared = ClaimOnNode::Seen {
            spec_files: vec!["/cdi/a.json".to_owned()],
            checkpoint_state: Some("PrepareCompleted".to_owned()),
        };
        assert!(prepared.is_prepared() && !prepared.is_gone());
        assert_eq!(
            prepared.describe(),
            "CDI spec files: /cdi/a.json; checkpoint: PrepareCompleted"
        );
        let half = ClaimOnNode::Seen {
            spec_files: vec![],
            checkpoint_state: Some("PrepareStarted".to_owned()),
        };
        assert!(!half.is_gone() && !half.is_prepared());
    }
}
