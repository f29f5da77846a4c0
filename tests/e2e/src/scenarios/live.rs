//! What the cluster shows of claims in use, checked while the single-gpu example runs:
//! `status.devices` (KEP-4817) written by the plugin after prepare, with the GPU's UUID; and
//! `kubectl tessera` (the CLI started as `kubectl-tessera`) on the live cluster: `top` lists the
//! pod on its GPU, `explain pod/NAME` answers as `explain --objects` does for the same objects.

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

use super::examples::ExampleRun;
use crate::context::Ctx;
use crate::wait::{Probe, until};

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
                            Some(_) => Probe::Done(()),
                            None => Probe::Waiting(serde_json::to_string(&entries)?),
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

/// The status check, then the `kubectl tessera` checks.
pub fn single_gpu_live<'a>(ctx: &'a Ctx, run: &'a ExampleRun) -> BoxFuture<'a, anyhow::Result<()>> {
    Box::pin(async move {
        device_status_holds_uuid(ctx, run).await?;
        kubectl_tessera(ctx, run).await
    })
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

    // top: the pod on its GPU, with the UUID the plugin reported.
    let top = cli_json(ctx, &plugin, &["top", "-o", "json"])?;
    let row = top["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["node"] == node.as_str())
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
                .is_some_and(|p| p.contains(&Value::String(pod_key.clone())))
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

    // explain pod/NAME on the live cluster = explain --objects on the same objects.
    let objects = dir.join("objects.yaml");
    write_objects(ctx, &objects).await?;
    let target = format!("pod/{pod_name}");
    let mut live = cli_json(
        ctx,
        &plugin,
        &["explain", &target, "-n", &run.namespace, "-o", "json"],
    )?;
    let objects_arg = objects.display().to_string();
    let mut from_files = cli_json(
        ctx,
        &plugin,
        &[
            "explain",
            "--objects",
            &objects_arg,
            "--pod",
            &pod_key,
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
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh directory under the temporary directory.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("tessera-e2e-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
