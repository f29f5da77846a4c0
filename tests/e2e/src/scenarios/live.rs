//! What the cluster shows of claims in use, checked while the single-gpu example runs:
//! `status.devices` (KEP-4817) written by the plugin after prepare, with the GPU's UUID;
//! `kubectl tessera` (the CLI started as `kubectl-tessera`) on the live cluster: `top` lists the
//! pod on its GPU, `explain pod/NAME` answers as `explain --objects` does for the same objects;
//! and on a local cluster with fake drivers the GPU metrics: the plugin's `/metrics` has the
//! utilization scripted for the claim's GPU (80%) labelled with the pod, and once the GPU is
//! scripted idle (0%) the pod gets a `GPUIdle` Event within the idle window local-up configures.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate, ResourceSlice};
use kube::api::Api;
use kube::api::ListParams;
use serde_json::Value;
use tessera_api::names::DRIVER_NAME;

use super::example::ExampleRun;
use crate::context::Ctx;
use crate::devices::PublishedDevice;
use crate::steps::AllocatedClaim;
use crate::wait::{Progress, until};

/// Every device of every claim of `run` gets a `status.devices` entry of this driver whose
/// `data.uuid` is the published device's UUID.
pub fn device_status_holds_uuid<'a>(
    ctx: &'a Ctx,
    run: &'a ExampleRun,
) -> BoxFuture<'a, anyhow::Result<()>> {
    Box::pin(async move {
        for claim in run.claims() {
            let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), claim.namespace());
            for device in claim.devices(&run.published)? {
                let uuid = device
                    .uuid()
                    .with_context(|| format!("{} publishes no uuid", device.name))?
                    .to_owned();
                let what = format!(
                    "status.devices of claim {}/{} to hold {} with data.uuid {uuid}",
                    claim.namespace(),
                    claim.name(),
                    device.name
                );
                until(&what, ctx.timeouts.event, || {
                    let api = api.clone();
                    let (uuid, device) = (uuid.clone(), device.name.clone());
                    let name = claim.name().to_owned();
                    async move {
                        let current = api.get(&name).await?;
                        let entries = current.status.and_then(|s| s.devices).unwrap_or_default();
                        let found = entries.iter().find(|e| {
                            e.driver == DRIVER_NAME
                                && e.device == device
                                && e.data.as_ref().and_then(|d| d.0.get("uuid"))
                                    == Some(&Value::String(uuid.clone()))
                        });
                        Ok(match found {
                            Some(_) => Progress::Done(()),
                            None => Progress::Waiting(serde_json::to_string(&entries)?),
                        })
                    }
                })
                .await?;
                ctx.say(format!(
                    "claim {}: status.devices has {} with UUID {uuid}",
                    claim.name(),
                    device.name
                ));
            }
        }
        Ok(())
    })
}

/// The status check, the `kubectl tessera` checks, then the GPU metrics.
pub fn single_gpu_live<'a>(ctx: &'a Ctx, run: &'a ExampleRun) -> BoxFuture<'a, anyhow::Result<()>> {
    Box::pin(async move {
        device_status_holds_uuid(ctx, run).await?;
        kubectl_tessera(ctx, run).await?;
        gpu_metrics(ctx, run).await
    })
}

/// How soon after a GPU is scripted idle its pod must have the `GPUIdle` Event: local-up's idle
/// window (3 s) plus its sample interval (1 s), the Event's write and this suite's polling.
const IDLE_EVENT_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

/// Puts back a samples file's earlier content when dropped (also when a check fails).
struct RestoreSamples {
    path: PathBuf,
    previous: Option<String>,
}

impl RestoreSamples {
    fn script(&self, text: &str) -> anyhow::Result<()> {
        let next = self.path.with_extension("new");
        std::fs::write(&next, text)?;
        std::fs::rename(&next, &self.path)
            .with_context(|| format!("cannot script {}", self.path.display()))
    }
}

impl Drop for RestoreSamples {
    fn drop(&mut self) {
        let _ = match &self.previous {
            Some(text) => self.script(text),
            None => std::fs::remove_file(&self.path).map_err(Into::into),
        };
    }
}

/// The claim's GPU whose telemetry the scenario scripts, and who holds it.
struct WatchedGpu<'a> {
    namespace: &'a str,
    pod: String,
    claim: &'a AllocatedClaim,
    node: String,
    device: PublishedDevice,
    uuid: String,
}

/// The scripted utilization of the claim's GPU in the plugin's `/metrics`, labelled with the pod;
/// then scripted idle, a `GPUIdle` Event on the pod. Local clusters with fake drivers only (the
/// fake NVML serves the script).
async fn gpu_metrics(ctx: &Ctx, run: &ExampleRun) -> anyhow::Result<()> {
    let crate::observer::RuntimeObserver::Local { local, .. } = &ctx.observer else {
        ctx.say("GPU metrics: not the local cluster, no scripted GPU telemetry; not checked");
        return Ok(());
    };
    let (pod, claims) = run.pods.first().context("the example has a pod")?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let claim = claims.first().context("the pod has a claim")?;
    let node = claim.node()?.to_owned();
    let device = claim.devices(&run.published)?[0].clone();
    let uuid = device
        .uuid()
        .with_context(|| format!("{} publishes no uuid", device.name))?
        .to_owned();
    let Ok(path) = local.gpu_samples_file(&node) else {
        ctx.say("GPU metrics: the local cluster has no fake drivers; not checked");
        return Ok(());
    };
    let previous = std::fs::read_to_string(&path).ok();
    let base = previous.clone().unwrap_or_default();
    let samples = RestoreSamples { path, previous };
    let gpu = WatchedGpu {
        namespace: &run.namespace,
        pod: pod_name,
        claim,
        node,
        device,
        uuid,
    };
    samples.script(&format!("{base}{} utilization=80\n", gpu.uuid))?;
    utilization_series(ctx, &gpu).await?;
    top_shows_utilization(ctx, &gpu).await?;

    // Scripted idle: the pod gets its GPUIdle Event within local-up's idle window (3 s), plus a
    // sample (1 s) and the Event's round trip.
    samples.script(&format!("{base}{} utilization=0\n", gpu.uuid))?;
    let scripted = std::time::Instant::now();
    idle_event_and_series(ctx, &gpu, scripted).await?;
    drop(samples);
    Ok(())
}

/// The plugin exports the scripted utilization (80) in the series labelled with the pod.
async fn utilization_series(ctx: &Ctx, gpu: &WatchedGpu<'_>) -> anyhow::Result<()> {
    let WatchedGpu {
        namespace,
        pod: pod_name,
        claim,
        node,
        device,
        uuid,
    } = gpu;
    let wanted = [
        ("namespace", *namespace),
        ("pod", pod_name.as_str()),
        ("claim", claim.name()),
        ("device", device.name.as_str()),
        ("uuid", uuid.as_str()),
    ];
    let what = format!(
        "tessera_node_gpu_utilization_percent 80 for {}/{pod_name} on {node}/{}",
        namespace, device.name
    );
    until(&what, ctx.timeouts.event, || async {
        let text = ctx.plugins.metrics(node).await?;
        let found = crate::scrape::samples(&text, "tessera_node_gpu_utilization_percent")
            .into_iter()
            .find(|(labels, _)| {
                wanted
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            });
        Ok(match found {
            Some((_, 80.0)) => Progress::Done(()),
            other => Progress::Waiting(format!("the pod's series: {other:?}")),
        })
    })
    .await?;
    ctx.say(format!("GPU metrics: {what}"));
    Ok(())
}

/// `kubectl tessera top` shows the utilization (the plugins' metrics through the API server's pod
/// proxy).
async fn top_shows_utilization(ctx: &Ctx, gpu: &WatchedGpu<'_>) -> anyhow::Result<()> {
    let WatchedGpu { node, device, .. } = gpu;
    let dir = tempfile_dir()?;
    let plugin = kubectl_tessera_binary(&dir)?;
    let top = cli_json(ctx, &plugin, &["top", "-o", "json"])?;
    let _ = std::fs::remove_dir_all(&dir);
    let row = top["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["node"] == node.as_str())
        .flat_map(|n| n["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["device"] == device.name.as_str())
        .with_context(|| format!("kubectl tessera top lists no {} on {node}", device.name))?;
    ensure!(
        row["utilizationPercent"] == 80,
        "kubectl tessera top shows utilization {} for {node}/{}, the plugin exports 80",
        row["utilizationPercent"],
        device.name
    );
    ctx.say(format!(
        "kubectl tessera top: {node}/{} at 80%",
        device.name
    ));
    Ok(())
}

/// Once the GPU is scripted idle (at `scripted`): the pod's `GPUIdle` Event within the bound, and
/// the idle claim's series.
async fn idle_event_and_series(
    ctx: &Ctx,
    gpu: &WatchedGpu<'_>,
    scripted: std::time::Instant,
) -> anyhow::Result<()> {
    let WatchedGpu {
        namespace,
        pod: pod_name,
        claim,
        node,
        ..
    } = gpu;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(ctx.client.clone(), namespace);
    let what = format!("a GPUIdle Event on pod {}/{pod_name}", namespace);
    let note = until(&what, ctx.timeouts.event, || async {
        let list = events.list(&ListParams::default()).await?;
        let found = list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("GPUIdle")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod_name.as_str())
        });
        Ok(match found {
            Some(event) => Progress::Done(event.note.unwrap_or_default()),
            None => Progress::Waiting("no GPUIdle Event yet".to_owned()),
        })
    })
    .await?;
    let took = scripted.elapsed();
    ensure!(
        took <= IDLE_EVENT_BOUND,
        "{what} came {took:?} after the GPU went idle; local-up's idle window is 3 s"
    );
    ctx.say(format!(
        "GPU metrics: {what} {took:.1?} after the GPU went idle: {note}"
    ));
    // And the idle claim's series (the monitoring scenario relies on this check for it: a
    // family without series is not declared in /metrics).
    let what = format!(
        "tessera_node_idle_claim 1 for claim {}/{} on {node}",
        namespace,
        claim.name()
    );
    until(&what, ctx.timeouts.event, || async {
        let text = ctx.plugins.metrics(node).await?;
        let found = crate::scrape::samples(&text, "tessera_node_idle_claim")
            .into_iter()
            .find(|(labels, _)| {
                labels.get("namespace").map(String::as_str) == Some(*namespace)
                    && labels.get("claim").map(String::as_str) == Some(claim.name())
            });
        Ok(match found {
            Some((_, 1.0)) => Progress::Done(()),
            other => Progress::Waiting(format!("the claim's idle series: {other:?}")),
        })
    })
    .await?;
    ctx.say(format!("GPU metrics: {what}"));
    Ok(())
}

/// The `tessera` CLI built next to this binary (tests/e2e/run builds both), as `kubectl-tessera`.
fn kubectl_tessera_binary(dir: &Path) -> anyhow::Result<PathBuf> {
    let cli = std::env::current_exe()?.with_file_name("tessera");
    ensure!(
        cli.is_file(),
        "{} is missing: build the CLI too (cargo build --bin tessera; tests/e2e/run does)",
        cli.display()
    );
    let plugin = dir.join("kubectl-tessera");
    std::os::unix::fs::symlink(&cli, &plugin)?;
    Ok(plugin)
}

/// Runs the CLI with `args` (and the suite's kubeconfig); its stdout as JSON.
fn cli_json(ctx: &Ctx, plugin: &Path, args: &[&str]) -> anyhow::Result<Value> {
    let mut command = Command::new(plugin);
    command.args(args);
    if let Some(kubeconfig) = &ctx.kubeconfig {
        command.arg("--kubeconfig").arg(kubeconfig);
    }
    let out = command.output()?;
    if !out.status.success() {
        bail!(
            "kubectl-tessera {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("kubectl-tessera {}: not JSON", args.join(" ")))
}

/// `value` without `allocationTimestamp`s (each run decides at its own time).
fn without_timestamps(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("allocationTimestamp");
            map.values_mut().for_each(without_timestamps);
        }
        Value::Array(items) => items.iter_mut().for_each(without_timestamps),
        _ => {}
    }
}

/// Every object `explain` reads, listed now, as one YAML file.
async fn write_objects(ctx: &Ctx, path: &Path) -> anyhow::Result<()> {
    async fn add<K>(ctx: &Ctx, documents: &mut Vec<String>) -> anyhow::Result<()>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let mut value = serde_json::to_value(
            Api::<K>::all(ctx.client.clone())
                .list(&ListParams::default())
                .await?,
        )?;
        // A typed list serializes without its items' kind; explain needs it.
        let kind = K::kind(&());
        for item in value["items"].as_array_mut().into_iter().flatten() {
            item["kind"] = Value::String(kind.to_string());
            item["apiVersion"] = Value::String(K::api_version(&()).to_string());
            documents.push(serde_yaml::to_string(item)?);
        }
        Ok(())
    }
    let mut documents = Vec::new();
    add::<Pod>(ctx, &mut documents).await?;
    add::<ResourceClaim>(ctx, &mut documents).await?;
    add::<ResourceClaimTemplate>(ctx, &mut documents).await?;
    add::<ResourceSlice>(ctx, &mut documents).await?;
    add::<DeviceClass>(ctx, &mut documents).await?;
    add::<Node>(ctx, &mut documents).await?;
    std::fs::write(path, documents.join("---\n"))?;
    Ok(())
}

async fn kubectl_tessera(ctx: &Ctx, run: &ExampleRun) -> anyhow::Result<()> {
    let dir = tempfile_dir()?;
    let plugin = kubectl_tessera_binary(&dir)?;
    let (pod, claims) = run.pods.first().context("the example has a pod")?;
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let pod_key = format!("{}/{pod_name}", run.namespace);
    let claim = claims.first().context("the pod has a claim")?;
    let node = claim.node()?.to_owned();
    let device = claim.devices(&run.published)?[0].clone();
    top_lists_the_pod(ctx, &plugin, &pod_key, &node, &device)?;
    explain_live_equals_files(ctx, &plugin, &dir, &run.namespace, &pod_name, &pod_key).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `kubectl tessera top`: the pod on its GPU, with the UUID the plugin reported.
fn top_lists_the_pod(
    ctx: &Ctx,
    plugin: &Path,
    pod_key: &str,
    node: &str,
    device: &PublishedDevice,
) -> anyhow::Result<()> {
    let top = cli_json(ctx, plugin, &["top", "-o", "json"])?;
    let row = top["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["node"] == node)
        .flat_map(|n| n["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["device"] == device.name.as_str())
        .with_context(|| {
            format!(
                "kubectl tessera top lists no {} on {node}: {top}",
                device.name
            )
        })?;
    let holder = row["heldBy"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| {
            h["pods"]
                .as_array()
                .is_some_and(|p| p.contains(&Value::String(pod_key.to_owned())))
        })
        .with_context(|| {
            format!(
                "kubectl tessera top does not list pod {pod_key} on {}: {row}",
                device.name
            )
        })?;
    ensure!(
        holder["preparedUuid"].as_str() == device.uuid(),
        "kubectl tessera top shows UUID {} for {}, published {:?}",
        holder["preparedUuid"],
        device.name,
        device.uuid()
    );
    ctx.say(format!(
        "kubectl tessera top: {pod_key} on {node}/{}",
        device.name
    ));
    Ok(())
}

/// `kubectl tessera explain pod/NAME` on the live cluster answers as `explain --objects` on the
/// same objects (written to `dir`).
async fn explain_live_equals_files(
    ctx: &Ctx,
    plugin: &Path,
    dir: &Path,
    namespace: &str,
    pod_name: &str,
    pod_key: &str,
) -> anyhow::Result<()> {
    // explain pod/NAME on the live cluster = explain --objects on the same objects.
    let objects = dir.join("objects.yaml");
    write_objects(ctx, &objects).await?;
    let target = format!("pod/{pod_name}");
    let mut live = cli_json(
        ctx,
        plugin,
        &["explain", &target, "-n", namespace, "-o", "json"],
    )?;
    let objects_arg = objects.display().to_string();
    let mut from_files = cli_json(
        ctx,
        plugin,
        &[
            "explain",
            "--objects",
            &objects_arg,
            "--pod",
            pod_key,
            "-o",
            "json",
        ],
    )?;
    without_timestamps(&mut live);
    without_timestamps(&mut from_files);
    ensure!(
        live == from_files,
        "kubectl tessera explain {target} answers {live}, but explain --objects answers {from_files}"
    );
    ctx.say(format!(
        "kubectl tessera explain {target}: the same answer as --objects ({})",
        live["action"]
            .as_str()
            .or(live["verdict"].as_str())
            .unwrap_or("see JSON")
    ));
    Ok(())
}

/// A fresh directory under the temporary directory.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("tessera-e2e-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
