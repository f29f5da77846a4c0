//! Reading the live cluster: the same [`Objects`] that `--objects` files give, listed from the
//! API server through a kubeconfig, so every subcommand that reads a cluster (`explain`, `top`)
//! answers the same for a live cluster and for its objects saved as files.
//!
//! One blocking function, [`load`], runs the lists on a current-thread runtime of its own: the
//! CLI is synchronous everywhere else. [`gpu_utilization`] reads the node plugins' GPU metrics
//! the same way, for `top`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::de::DeserializeOwned;
use tessera_placement::ClusterObjects;

use crate::objects::Objects;

/// Which cluster to read.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// The kubeconfig to read the cluster through [default: $KUBECONFIG, else ~/.kube/config,
    /// else the in-cluster service account].
    #[arg(long, env = "TESSERA_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use [default: its current context].
    #[arg(long, env = "TESSERA_CONTEXT")]
    pub context: Option<String>,
}

/// `--objects` files when given, else the live cluster.
pub fn objects(files: &[PathBuf], cluster: &ClusterArgs) -> anyhow::Result<Objects> {
    if files.is_empty() {
        load(cluster)
    } else {
        Objects::load(files)
    }
}

/// Lists what `--objects` files hold (Pods, ResourceClaims, ResourceClaimTemplates,
/// ResourceSlices, DeviceClasses, Nodes) from the cluster `args` names.
pub fn load(args: &ClusterArgs) -> anyhow::Result<Objects> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime for the API requests")?;
    runtime.block_on(async {
        let client = client(args).await?;
        let cluster = ClusterObjects {
            pods: list::<Pod>(&client, "pods").await?,
            claims: list::<ResourceClaim>(&client, "resourceclaims").await?,
            templates: list::<ResourceClaimTemplate>(&client, "resourceclaimtemplates").await?,
            slices: list::<ResourceSlice>(&client, "resourceslices").await?,
            classes: list::<DeviceClass>(&client, "deviceclasses").await?,
            nodes: list::<Node>(&client, "nodes").await?,
            // Preemption honours them; without the right to list them explain goes on without.
            budgets: list::<PodDisruptionBudget>(&client, "poddisruptionbudgets")
                .await
                .unwrap_or_default(),
        };
        Ok(Objects {
            cluster,
            // Not listed live yet (clusters without the GenericWorkload API answer 404): a gang
            // named by a PodGroup is explained from --objects files; label-named gangs work live.
            pod_groups: Vec::new(),
            skipped: Vec::new(),
            live: true,
        })
    })
}

/// Label of Tessera's node plugin pods (the chart's DaemonSets).
const PLUGIN_POD_SELECTOR: &str = "app.kubernetes.io/component=kubelet-plugin";

/// Each device's GPU utilization, `(node, device)` to percent, from the node plugins' `/metrics`
/// (`tessera_node_gpu_utilization_percent`) read through the API server's pod proxy (`get` on
/// `pods/proxy`). Plugins whose metrics cannot be read, or that have no GPU metrics, are left out.
pub fn gpu_utilization(args: &ClusterArgs) -> anyhow::Result<BTreeMap<(String, String), u32>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime for the API requests")?;
    runtime.block_on(async {
        let client = client(args).await?;
        let plugins = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().labels(PLUGIN_POD_SELECTOR))
            .await
            .context("list the node plugin pods")?;
        let mut utilization = BTreeMap::new();
        for pod in plugins.items {
            let (Some(node), Some(path)) = (
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                metrics_path(&pod),
            ) else {
                continue;
            };
            let request = http::Request::get(&path).body(Vec::new())?;
            let Ok(text) = client.request_text(request).await else {
                continue;
            };
            for (device, percent) in utilization_of(&text) {
                utilization.insert((node.clone(), device), percent);
            }
        }
        Ok(utilization)
    })
}

/// The series name of the plugins' per-device utilization.
const UTILIZATION_METRIC: &str = "tessera_node_gpu_utilization_percent";

/// Each device's utilization in a node plugin's `/metrics` text (the highest of its series).
pub fn utilization_of(metrics: &str) -> BTreeMap<String, u32> {
    let mut found: BTreeMap<String, u32> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line
            .strip_prefix(UTILIZATION_METRIC)
            .and_then(|r| r.strip_prefix('{'))
        else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let device = labels.split(',').find_map(|l| l.strip_prefix("device=\""));
        let (Some(device), Ok(value)) = (device, value.trim().parse::<f64>()) else {
            continue;
        };
        let percent = value.clamp(0.0, 100.0).round() as u32;
        let entry = found
            .entry(device.trim_end_matches('"').to_owned())
            .or_default();
        *entry = (*entry).max(percent);
    }
    found
}

/// The pod-proxy path of a plugin pod's `/metrics` (its first container port).
fn metrics_path(pod: &Pod) -> Option<String> {
    let port = pod
        .spec
        .as_ref()?
        .containers
        .first()?
        .ports
        .as_ref()?
        .first()?
        .container_port;
    Some(format!(
        "/api/v1/namespaces/{}/pods/{}:{port}/proxy/metrics",
        pod.metadata.namespace.as_deref()?,
        pod.metadata.name.as_deref()?
    ))
}

async fn client(args: &ClusterArgs) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => from_file(path, &options).await?,
        None if args.context.is_some() => {
            let kubeconfig = Kubeconfig::read().context(
                "read the kubeconfig ($KUBECONFIG or ~/.kube/config) to use --context; or pass --kubeconfig",
            )?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .context("use the kubeconfig's --context")?
        }
        None => kube::Config::infer().await.context(
            "find a cluster: no --kubeconfig, no usable $KUBECONFIG or ~/.kube/config, and not in a pod",
        )?,
    };
    kube::Client::try_from(config).context("build the Kubernetes client")
}

async fn from_file(path: &Path, options: &KubeConfigOptions) -> anyhow::Result<kube::Config> {
    let kubeconfig = Kubeconfig::read_from(path)
        .with_context(|| format!("read the kubeconfig {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, options)
        .await
        .with_context(|| {
            format!(
                "use the kubeconfig {}: check its context, cluster and user",
                path.display()
            )
        })
}

async fn list<K>(client: &kube::Client, plural: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.with_context(|| {
            format!("list {plural} (the CLI needs list on {plural} in all namespaces)")
        })?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        items.extend(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}
