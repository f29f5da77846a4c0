//! A driver upgrade under a running plugin (docs/operations.md, "Driver upgrades"), simulated in a
//! node's fake driver root: the driver's libraries and firmware are laid again under a new version
//! and the links the loader cache names (`libcuda.so.1`, ...) point at them, as an upgrade does. The plugin notices
//! (`tessera_node_driver_reloads_total{result="success"}`, a `DriverReloaded` Event on the Node),
//! the next claim's CDI spec and its container get the new `libcuda.so.<version>`, and the claim
//! prepared before keeps the old one.
//! The links are pointed back at the end (the plugin follows them back).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams, PostParams};

use super::outcome::ScenarioOutcome;
use crate::context::Ctx;
use crate::objects::{self, PlacedBy, gpu_claim};
use crate::observer::ClaimOnNode;
use crate::scrape::samples;
use crate::steps::{AllocatedClaim, wait_allocated, wait_running};
use crate::wait::{Progress, until};

const NAMESPACE: &str = "tessera-e2e-driver-upgrade";
/// The version the simulated upgrade lays.
const NEW_VERSION: &str = "999.88.77";
/// The plugin looks at its driver root every 30 s.
const NOTICED_WITHIN: Duration = Duration::from_secs(120);

pub async fn driver_upgrade(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let Some(local) = ctx.observer.local().filter(|l| l.has_fake_drivers()) else {
        return Ok(ScenarioOutcome::Skipped(
            "needs the local cluster's fake driver roots".to_owned(),
        ));
    };
    let published = ctx.published().await?;
    // An unmanaged node (kube-scheduler places there; the managed one's devices are tainted).
    let node = published
        .nodes()
        .into_iter()
        .find(|n| published.whole_gpus(n).iter().any(|d| d.taints.is_empty()))
        .context("no node has untainted devices")?;
    let root = local
        .node(&node)?
        .driver_root
        .clone()
        .context("the node has no fake driver root")?;
    ctx.fresh_namespace(NAMESPACE).await?;
    objects::create_namespace(&ctx.client, NAMESPACE).await?;

    let (before, old_version) = run_one(ctx, &node, "before").await?;
    ctx.say(format!(
        "{node}: driver {old_version} under {}",
        root.display()
    ));
    ensure!(
        old_version != NEW_VERSION,
        "the node already has {NEW_VERSION}"
    );
    lay_version(&root, &old_version, NEW_VERSION)?;
    let outcome = upgraded(ctx, &node, &before, &old_version).await;
    // Back to the old driver (the plugin follows it back at its next look).
    relink(&root.join("usr/lib"), NEW_VERSION, &old_version, false)?;
    outcome?;
    ctx.delete_namespace(NAMESPACE).await?;
    Ok(ScenarioOutcome::Passed)
}

/// After the upgrade: the plugin says it read the new driver; a new claim's spec and container
/// get its files; the claim from before keeps the old ones.
async fn upgraded(
    ctx: &Ctx,
    node: &str,
    before: &AllocatedClaim,
    old_version: &str,
) -> anyhow::Result<()> {
    until(
        &format!("the plugin on {node} to read driver {NEW_VERSION}"),
        NOTICED_WITHIN,
        || async {
            let text = ctx.plugins.metrics(node).await?;
            let reloads: f64 = samples(&text, "tessera_node_driver_reloads_total")
                .iter()
                .filter(|(labels, _)| labels.get("result").map(String::as_str) == Some("success"))
                .map(|(_, value)| value)
                .sum();
            Ok(if reloads >= 1.0 {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("{reloads} successful driver reloads"))
            })
        },
    )
    .await?;
    reload_event(ctx, node, old_version).await?;
    let (after, version) = run_one(ctx, node, "after").await?;
    ensure!(
        version == NEW_VERSION,
        "claim {} prepared after the upgrade got driver {version}, expected {NEW_VERSION}",
        after.name()
    );
    let kept = spec_driver_version(ctx, node, before)?;
    ensure!(
        kept == old_version,
        "claim {} prepared before the upgrade now names driver {kept}, expected it to keep {old_version}",
        before.name()
    );
    ctx.say(format!(
        "{node}: claim after the upgrade gets libcuda.so.{NEW_VERSION}; the one before keeps {old_version}"
    ));
    Ok(())
}

/// The plugin's `DriverReloaded` Event on the Node, naming both versions (Events of
/// cluster-scoped objects are in `default`).
async fn reload_event(ctx: &Ctx, node: &str, old_version: &str) -> anyhow::Result<()> {
    let events = Api::<Event>::namespaced(ctx.client.clone(), "default");
    let selector =
        format!("involvedObject.kind=Node,involvedObject.name={node},reason=DriverReloaded");
    let wanted = format!("driver {old_version} under");
    let to = format!("-> driver {NEW_VERSION} under");
    let message = until(
        &format!("a DriverReloaded Event on node {node}"),
        ctx.timeouts.event,
        || async {
            let found = events
                .list(&ListParams::default().fields(&selector))
                .await
                .with_context(|| format!("cannot list the events of node {node}"))?
                .items;
            Ok(
                match found
                    .iter()
                    .filter_map(|e| e.message.clone())
                    .find(|m| m.contains(&wanted) && m.contains(&to))
                {
                    Some(message) => Progress::Done(message),
                    None => Progress::Waiting(format!("{} DriverReloaded event(s)", found.len())),
                },
            )
        },
    )
    .await?;
    ctx.say(format!("node event: {message}"));
    Ok(())
}

/// A one-GPU claim and pod `name` on `node`, running; the driver version its CDI spec names
/// (checked against the container's checker report).
async fn run_one(ctx: &Ctx, node: &str, name: &str) -> anyhow::Result<(AllocatedClaim, String)> {
    Api::<ResourceClaim>::namespaced(ctx.client.clone(), NAMESPACE)
        .create(
            &PostParams::default(),
            &gpu_claim(NAMESPACE, name, 1, None)?,
        )
        .await
        .with_context(|| format!("cannot create claim {name}"))?;
    let pod = objects::gpu_pod(NAMESPACE, name, name, PlacedBy::SchedulerOn(node))?;
    Api::<Pod>::namespaced(ctx.client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("cannot create pod {name}"))?;
    let mut claims = wait_allocated(ctx, NAMESPACE, name).await?;
    let claim = claims.pop().context("the pod has no claim")?;
    let pod = wait_running(ctx, NAMESPACE, name).await?;
    let version = spec_driver_version(ctx, node, &claim)?;
    let view = until(
        &format!("the checker's report of {name}/ctr"),
        ctx.timeouts.run,
        || async {
            Ok(match ctx.observer.container_view(&pod, "ctr").await? {
                Some(view) if view.check.is_some() => Progress::Done(view),
                _ => Progress::Waiting("no report yet".to_owned()),
            })
        },
    )
    .await?;
    let report = view.check.context("checked above")?;
    let libcuda = format!("libcuda.so.{version}");
    ensure!(
        report
            .driver_files
            .iter()
            .any(|f| f.path.ends_with(&libcuda)),
        "container {name}/ctr does not have {libcuda}: {:?}",
        report
            .driver_files
            .iter()
            .map(|f| &f.path)
            .collect::<Vec<_>>()
    );
    Ok((claim, version))
}

/// The driver version the claim's CDI spec on `node` mounts (`libcuda.so.<version>`).
fn spec_driver_version(ctx: &Ctx, node: &str, claim: &AllocatedClaim) -> anyhow::Result<String> {
    let ClaimOnNode::Seen { spec_files, .. } = ctx.observer.claim_on_node(node, claim.uid())?
    else {
        bail!("the claim's CDI spec is not observable here");
    };
    let file = spec_files.first().context("the claim has no CDI spec")?;
    let text = std::fs::read_to_string(file)?;
    let marker = "libcuda.so.";
    text.match_indices(marker)
        .map(|(at, _)| &text[at + marker.len()..])
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect::<String>()
        })
        .find(|v| v.contains('.') && !v.ends_with('.'))
        .with_context(|| format!("{file} mounts no libcuda.so.<version>"))
}

/// Lays driver `new` beside `old` under `root`, as an upgrade's files land: each `*.so.<old>`
/// library is copied to `*.so.<new>` and every link to it (`libcuda.so.1`, which the loader
/// cache names) is pointed at the copy; the firmware directory is copied too.
fn lay_version(root: &Path, old: &str, new: &str) -> anyhow::Result<()> {
    relink(&root.join("usr/lib"), old, new, true)?;
    let firmware = root.join("lib/firmware/nvidia");
    if firmware.join(old).is_dir() {
        std::fs::create_dir_all(firmware.join(new))?;
        for file in std::fs::read_dir(firmware.join(old))? {
            let file = file?;
            std::fs::copy(file.path(), firmware.join(new).join(file.file_name()))?;
        }
    }
    Ok(())
}

/// Under `dir` (recursively): copies `*.so.<from>` files to `*.so.<to>` when `copy`, and points
/// links to a `*.so.<from>` at `*.so.<to>`.
fn relink(dir: &Path, from: &str, to: &str, copy: bool) -> anyhow::Result<()> {
    let suffix = format!(".so.{from}");
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if meta.is_dir() {
            relink(&path, from, to, copy)?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path)?;
            let Some(stem) = target.to_str().and_then(|t| t.strip_suffix(&suffix)) else {
                continue;
            };
            let temp = path.with_extension("tessera-e2e-link");
            let _ = std::fs::remove_file(&temp);
            std::os::unix::fs::symlink(format!("{stem}.so.{to}"), &temp)?;
            std::fs::rename(&temp, &path)?;
        } else if copy && let Some(stem) = name.strip_suffix(&suffix) {
            std::fs::copy(&path, path.with_file_name(format!("{stem}.so.{to}")))?;
        }
    }
    Ok(())
}
