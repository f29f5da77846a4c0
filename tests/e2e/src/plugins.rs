//! Killing and restarting a node's plugin: a process of tests/e2e/local-up --install processes,
//! or a DaemonSet pod of the chart (the local cluster installed by helm, kind).

use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use crate::local::LocalCluster;
use crate::wait::{Progress, until};

/// Label of the chart's plugin pods (deploy/helm/tessera).
const PLUGIN_POD_SELECTOR: &str = "app.kubernetes.io/component=kubelet-plugin";
/// Label of the chart's controller pods.
const CONTROLLER_POD_SELECTOR: &str = "app.kubernetes.io/component=controller";

pub enum PluginControl {
    Local(LocalCluster),
    /// The chart's plugin pods in `namespace`.
    Pods {
        client: kube::Client,
        namespace: String,
    },
}

impl PluginControl {
    /// SIGKILLs the plugin of `node` (pods: deletes its pod with no grace period). Returns
    /// what was killed.
    pub async fn kill(&self, node: &str) -> anyhow::Result<String> {
        match self {
            PluginControl::Local(local) => {
                let plugin = local.plugin(node)?;
                let pid = plugin.kill()?;
                Ok(format!("{} (pid {pid}), SIGKILL", plugin.name))
            }
            PluginControl::Pods { client, namespace } => {
                let pod = plugin_pod(client, namespace, node)
                    .await?
                    .with_context(|| format!("no plugin pod runs on {node} in {namespace}"))?;
                let name = pod.metadata.name.unwrap_or_default();
                Api::<Pod>::namespaced(client.clone(), namespace)
                    .delete(
                        &name,
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..DeleteParams::default()
                        },
                    )
                    .await
                    .with_context(|| format!("cannot delete plugin pod {namespace}/{name}"))?;
                Ok(format!(
                    "plugin pod {namespace}/{name}, deleted with grace period 0"
                ))
            }
        }
    }

    /// Starts the plugin of `node` again (pods: waits for the DaemonSet's new pod to be ready).
    pub async fn start(&self, node: &str, timeout: Duration) -> anyhow::Result<()> {
        match self {
            PluginControl::Local(local) => {
                let plugin = local.plugin(node)?;
                plugin.start()?;
                until(&format!("{} to start", plugin.name), timeout, || async {
                    Ok(match plugin.running_pid() {
                        Some(pid) => Progress::Done(pid),
                        None => Progress::Waiting(format!(
                            "no live pid in {} yet",
                            plugin.pid_file.display()
                        )),
                    })
                })
                .await?;
                Ok(())
            }
            PluginControl::Pods { client, namespace } => {
                until(
                    &format!("a ready plugin pod on {node}"),
                    timeout,
                    || async {
                        let pod = plugin_pod(client, namespace, node).await?;
                        Ok(match pod {
                            Some(pod)
                                if is_ready(&pod) && pod.metadata.deletion_timestamp.is_none() =>
                            {
                                Progress::Done(())
                            }
                            Some(pod) => Progress::Waiting(format!(
                                "pod {} not ready",
                                pod.metadata.name.unwrap_or_default()
                            )),
                            None => Progress::Waiting("no pod yet".to_owned()),
                        })
                    },
                )
                .await
            }
        }
    }
}

impl PluginControl {
    /// Rolls out the DaemonSet that runs `node`'s plugin as `kubectl rollout restart` does (a new
    /// `kubectl.kubernetes.io/restartedAt` annotation on its pod template), then waits until a
    /// new pod of it is ready on `node` and the old one is going (with surge both run for a
    /// while). Only for the chart's pods. Returns what was replaced.
    pub async fn rollout_restart(&self, node: &str, timeout: Duration) -> anyhow::Result<String> {
        self.rollout_restart_on(&[node], timeout).await
    }

    /// [`Self::rollout_restart`] of the DaemonSets that run the plugins of `nodes` (one for all,
    /// or one per node as on the local cluster), waiting for the new pods on every one of them.
    pub async fn rollout_restart_on(
        &self,
        nodes: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let PluginControl::Pods { client, namespace } = self else {
            bail!("a DaemonSet rollout needs the chart's plugin pods (Tessera installed by helm)");
        };
        let mut old = Vec::new();
        for node in nodes {
            old.push(
                plugin_pod(client, namespace, node)
                    .await?
                    .with_context(|| format!("no plugin pod runs on {node} in {namespace}"))?,
            );
        }
        // One DaemonSet may run every node's plugin, or one each (the local cluster's chart):
        // each is restarted once.
        let mut daemonsets = std::collections::BTreeSet::new();
        for pod in &old {
            daemonsets.insert(
                pod.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "DaemonSet")
                    .map(|o| o.name.clone())
                    .with_context(|| {
                        format!(
                            "plugin pod {namespace}/{} has no DaemonSet owner",
                            pod.metadata.name.as_deref().unwrap_or_default()
                        )
                    })?,
            );
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis()
            .to_string();
        let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": stamp,
        }}}}});
        let api = Api::<DaemonSet>::namespaced(client.clone(), namespace);
        for daemonset in &daemonsets {
            api.patch(daemonset, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("cannot restart DaemonSet {namespace}/{daemonset}"))?;
        }
        let daemonset = daemonsets.into_iter().collect::<Vec<_>>().join(", ");
        let mut replaced = Vec::new();
        for (node, old_pod) in nodes.iter().zip(&old) {
            let old_name = old_pod.metadata.name.clone().unwrap_or_default();
            let old_uid = old_pod.metadata.uid.clone().unwrap_or_default();
            let what = format!("DaemonSet(s) {daemonset} to replace {old_name} on {node}");
            let new_name = wait_replaced(client, namespace, node, &old_uid, &what, timeout).await?;
            replaced.push(format!("{old_name} replaced by {new_name}"));
        }
        Ok(format!(
            "DaemonSet(s) {daemonset} in {namespace} rolled out: {}",
            replaced.join(", ")
        ))
    }

    /// The `/metrics` text of `node`'s plugin: through the API server's pod proxy (the chart's
    /// pods) or from the process's metrics address.
    pub async fn metrics(&self, node: &str) -> anyhow::Result<String> {
        match self {
            PluginControl::Local(local) => {
                let plugin = local.plugin(node)?;
                let address = plugin.metrics.as_deref().with_context(|| {
                    format!("local-up recorded no metrics address for {}", plugin.name)
                })?;
                crate::scrape::address_metrics(address).await
            }
            PluginControl::Pods { client, namespace } => {
                let pod = plugin_pod(client, namespace, node)
                    .await?
                    .with_context(|| format!("no plugin pod runs on {node} in {namespace}"))?;
                crate::scrape::pod_metrics(client, &pod).await
            }
        }
    }

    /// The `/metrics` texts of the controller replicas (none when there is no controller).
    pub async fn controller_metrics(&self) -> anyhow::Result<Vec<String>> {
        match self {
            PluginControl::Local(local) => {
                let mut texts = Vec::new();
                if let Some(address) = local.controller.as_ref().and_then(|c| c.metrics.as_deref())
                {
                    texts.push(crate::scrape::address_metrics(address).await?);
                }
                Ok(texts)
            }
            PluginControl::Pods { client, namespace } => {
                crate::scrape::pods_metrics(client, namespace, CONTROLLER_POD_SELECTOR).await
            }
        }
    }

    /// The namespace of the chart's pods (the plugin's, and its MPS daemon pods'); `None` for
    /// plugin processes.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            PluginControl::Pods { namespace, .. } => Some(namespace),
            PluginControl::Local(_) => None,
        }
    }
}

async fn plugin_pod(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> anyhow::Result<Option<Pod>> {
    let mut live = live_plugin_pods(client, namespace, node).await?;
    if live.len() > 1 {
        bail!("{} plugin pods run on {node}; expected one", live.len());
    }
    Ok(live.pop())
}

/// The plugin pods on `node` that are not being deleted (two during a surge rollout).
/// Waits until a plugin pod other than `old_uid` is ready on `node` and the old one is going (with
/// surge both run for a while); returns the new pod's name.
async fn wait_replaced(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    old_uid: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    until(what, timeout, || async {
        let live = live_plugin_pods(client, namespace, node).await?;
        let old_live = live
            .iter()
            .any(|p| p.metadata.uid.as_deref() == Some(old_uid));
        let new = live
            .iter()
            .find(|p| p.metadata.uid.as_deref() != Some(old_uid));
        Ok(match new {
            Some(pod) if !old_live && is_ready(pod) => {
                Progress::Done(pod.metadata.name.clone().unwrap_or_default())
            }
            Some(pod) => Progress::Waiting(format!(
                "pod {} ({}ready){}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                if is_ready(pod) { "" } else { "not " },
                if old_live {
                    ", the old one still live"
                } else {
                    ""
                }
            )),
            None => Progress::Waiting(if old_live {
                "only the old plugin pod on the node".to_owned()
            } else {
                "no live plugin pod on the node".to_owned()
            }),
        })
    })
    .await
}

async fn live_plugin_pods(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> anyhow::Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(
            &ListParams::default()
                .labels(PLUGIN_POD_SELECTOR)
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .with_context(|| format!("cannot list plugin pods in {namespace}"))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
