//! Sharing beyond `shares-memory` / `shares-replicas` (issue 13), and NVIDIA's demos after
//! `tessera migrate`:
//!
//! - `nvidia-selectors`: deploy/examples/nvidia-selectors (NVIDIA's selectors demo, migrated): an
//!   inference GPU picked by memory and compute capability, a pair of Hopper GPUs of one product.
//! - `nvidia-shares-integer` / `nvidia-shares-memory`: NVIDIA's consumable-shares demos, migrated
//!   (deploy/examples/nvidia-shares-*), on the dgx-h100 node switched to `4` shares / `memory`:
//!   every replica of the Deployment is allocated the same GPU, each its own share.
//! - `extended-resource-shared`: pods with `limits: {nvidia.com/gpu.shared: 1}` and no claims
//!   (the device plugin's shared resource name) share one GPU of a node in `4`-shares mode.
//! - `shares-unlimited`: in `unlimited` mode, more claims than any share count share gpu-0, each
//!   consuming the memory it asks for (none, or 20Gi).
//! - `shares-mig`: the MIG node switched to `2` shares: two pods asking
//!   `mig-1g.10gb.gpu.tessera.dev` share one MIG device, a third gets another.
//!
//! The node is switched with `helm upgrade` and back afterwards (see [`super::sharing`]).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use tessera_api::shares::{ENV_MEMORY_LIMIT, ENV_SHARES, ENV_SHARES_TOTAL};

use super::example::{ExampleRun, run_example};
use super::outcome::ScenarioOutcome;
use super::sharing::{
    GIB, Share, SharedNode, check_running, consumed_bytes, create, ensure_env, pod, pods_of,
    share_of, template, with_sharing, with_sharing_on,
};
use crate::claims::EXTENDED_RESOURCES_ENTRY;
use crate::context::Ctx;
use crate::devices::{PublishedAttribute, PublishedDevice};
use crate::manifest::Manifest;
use crate::objects::{PRINT_GPU_ENV, create_namespace};
use crate::steps::{AllocatedClaim, check_prepared, check_unprepared};
use crate::wait::{Progress, until};

fn text_attribute<'a>(device: &'a PublishedDevice, name: &str) -> Option<&'a str> {
    match device.attribute(name)? {
        PublishedAttribute::String(s) | PublishedAttribute::Version(s) => Some(s),
        _ => None,
    }
}

/// `major.minor` of a compute capability (`8.0`, `9.0.0`).
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The claims of the pod called `name`.
fn claims_of<'a>(run: &'a ExampleRun, name: &str) -> anyhow::Result<&'a [AllocatedClaim]> {
    run.pods
        .iter()
        .find(|(pod, _)| pod.metadata.name.as_deref() == Some(name))
        .map(|(_, claims)| claims.as_slice())
        .with_context(|| format!("the example has no pod {name}"))
}

pub async fn nvidia_selectors(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    run_example(ctx, "nvidia-selectors", |run| {
        let [inference] = claims_of(run, "inference")? else {
            anyhow::bail!("pod inference must have one claim");
        };
        let devices = inference.devices(&run.published)?;
        ensure!(
            devices.len() == 1,
            "inference got {} devices",
            devices.len()
        );
        let gpu = devices[0];
        ensure!(gpu.is_whole_gpu(), "{} is not a whole GPU", gpu.name);
        let memory = gpu.capacity_bytes("memory").unwrap_or(u128::MAX);
        ensure!(
            memory <= 80 * GIB,
            "{} has {memory} bytes of memory, the selector asks for at most 80Gi",
            gpu.name
        );
        let cc = text_attribute(gpu, "cudaComputeCapability").unwrap_or_default();
        ensure!(
            major_minor(cc).is_some_and(|v| v > (7, 5)),
            "{} has compute capability `{cc}`, the selector asks for more than 7.5",
            gpu.name
        );

        let [training] = claims_of(run, "training")? else {
            anyhow::bail!("pod training must have one claim");
        };
        let devices = training.devices(&run.published)?;
        ensure!(devices.len() == 2, "training got {} devices", devices.len());
        ensure!(devices[0].name != devices[1].name, "the same device twice");
        for gpu in &devices {
            ensure!(
                gpu.is_whole_gpu()
                    && text_attribute(gpu, "architecture") == Some("Hopper")
                    && gpu.capacity_bytes("memory").unwrap_or_default() > 16 * GIB,
                "{} is not a Hopper GPU of more than 16Gi: {}",
                gpu.name,
                gpu.summary()
            );
        }
        let products: BTreeSet<Option<&str>> = devices.iter().map(|d| d.product()).collect();
        ensure!(
            products.len() == 1,
            "matchAttribute productName: the pair has {products:?}"
        );
        Ok(())
    })
    .await
}

pub async fn nvidia_shares_integer(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "4", |node| {
        shared_example(
            ctx,
            node,
            "nvidia-shares-integer",
            "integer-sharing",
            |share, env| {
                ensure!(
                    consumed_bytes(share, "shares")? == 1,
                    "pod {}: consumed {:?}, expected one share",
                    share.pod,
                    share.consumed
                );
                ensure_env(env, &share.pod, ENV_SHARES, "1")?;
                ensure_env(env, &share.pod, ENV_SHARES_TOTAL, "4")
            },
        )
    })
    .await
}

pub async fn nvidia_shares_memory(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "memory", |node| {
        shared_example(
            ctx,
            node,
            "nvidia-shares-memory",
            "memory-sharing",
            |share, env| {
                ensure!(
                    consumed_bytes(share, "memory")? == 4 * GIB,
                    "pod {}: consumed {:?}, expected memory 4Gi",
                    share.pod,
                    share.consumed
                );
                ensure_env(env, &share.pod, ENV_MEMORY_LIMIT, &(4 * GIB).to_string())
            },
        )
    })
    .await
}

/// Applies example `name` (one Deployment, pods labelled `app`), and checks that every replica's
/// claim got one share of the same device of `node`, each passing `check` (with the environment
/// its container printed); then deletes it and checks the claims are unprepared.
async fn shared_example(
    ctx: &Ctx,
    node: String,
    name: &str,
    app: &str,
    check: impl Fn(&Share, &BTreeMap<String, String>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = ctx.examples_dir.join(name);
    let manifest = Manifest::read_dir(&dir)?;
    let namespace = manifest
        .namespaces()
        .into_iter()
        .next()
        .with_context(|| format!("{} creates no namespace", dir.display()))?;
    let replicas = manifest
        .deployments()
        .next()
        .and_then(|d| d.spec.replicas)
        .with_context(|| format!("{} has no Deployment with replicas", dir.display()))?;
    let replicas = usize::try_from(replicas)?;
    ctx.fresh_namespace(&namespace).await?;
    manifest.apply(&ctx.client).await?;
    ctx.say(format!("applied {} ({replicas} replicas)", dir.display()));
    let pods = until(
        &format!("the Deployment's {replicas} pods"),
        ctx.timeouts.allocate,
        || async {
            let pods = pods_of(ctx, &namespace, app).await?;
            Ok(if pods.len() == replicas {
                Progress::Done(pods)
            } else {
                Progress::Waiting(format!("pods: {pods:?}"))
            })
        },
    )
    .await?;
    let mut shares = Vec::new();
    for pod in &pods {
        shares.push(share_of(ctx, &namespace, pod).await?);
    }
    one_device_of_node(&shares, &node)?;
    ctx.say(format!(
        "{replicas} replicas share {node}/{}: {:?}",
        shares[0].device,
        shares.iter().map(|s| &s.consumed).collect::<Vec<_>>()
    ));
    for share in &shares {
        let env = check_running(ctx, &namespace, share).await?;
        check(share, &env)?;
    }
    let claims: Vec<AllocatedClaim> = shares.iter().map(|s| s.claim.clone()).collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(&namespace).await?;
    check_unprepared(ctx, &claims).await
}

/// Every share is of one device of `node`, each with its own share id.
fn one_device_of_node(shares: &[Share], node: &str) -> anyhow::Result<()> {
    let devices: BTreeSet<(&str, &str)> = shares
        .iter()
        .map(|s| Ok((s.claim.node()?, s.device.as_str())))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        devices.len() == 1 && devices.iter().all(|(n, _)| *n == node),
        "the claims were allocated {devices:?}; expected one shared device of {node}"
    );
    let ids: BTreeSet<&str> = shares.iter().map(|s| s.share_id.as_str()).collect();
    ensure!(
        ids.len() == shares.len(),
        "share ids must differ: {:?}",
        shares.iter().map(|s| &s.share_id).collect::<Vec<_>>()
    );
    Ok(())
}

const EXTENDED_NAMESPACE: &str = "tessera-e2e-extended-shared";

/// Two pods asking `nvidia.com/gpu.shared: 1` (no claims): kube-scheduler makes a claim for each
/// from class `shared.gpu.tessera.dev`, and both get one of the 4 shares of one GPU.
pub async fn extended_resource_shared(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "4", |node| extended_shared_body(ctx, node)).await
}

async fn extended_shared_body(ctx: &Ctx, node: String) -> anyhow::Result<()> {
    let namespace = EXTENDED_NAMESPACE;
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    let mut shares = Vec::new();
    for i in 0..2 {
        let name = format!("shared-{i}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name,
                         "labels": {"app.kubernetes.io/part-of": "tessera-e2e"}},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [{
                    "name": "ctr",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", PRINT_GPU_ENV],
                    "resources": {"limits": {"nvidia.com/gpu.shared": 1}},
                }],
            },
        }))?;
        create(ctx, namespace, &pod).await?;
        let share = share_of(ctx, namespace, &name).await?;
        ensure!(
            share.claim.entry == EXTENDED_RESOURCES_ENTRY,
            "pod {name}'s claim {} is not its extended-resource claim",
            share.claim.name()
        );
        let requests: Vec<String> = share
            .claim
            .claim
            .spec
            .iter()
            .flat_map(|s| s.devices.iter())
            .flat_map(|d| d.requests.iter().flatten())
            .filter_map(|r| r.exactly.as_ref().map(|e| e.device_class_name.clone()))
            .collect();
        ensure!(
            requests == ["shared.gpu.tessera.dev"],
            "the scheduler's claim for nvidia.com/gpu.shared asks for {requests:?}"
        );
        ensure!(
            consumed_bytes(&share, "shares")? == 1,
            "pod {name}: consumed {:?}, expected one share",
            share.consumed
        );
        shares.push(share);
    }
    one_device_of_node(&shares, &node)?;
    ctx.say(format!(
        "two pods asking nvidia.com/gpu.shared: 1 share {node}/{}",
        shares[0].device
    ));
    for share in &shares {
        let env = check_running(ctx, namespace, share).await?;
        ensure_env(&env, &share.pod, ENV_SHARES, "1")?;
        ensure_env(&env, &share.pod, ENV_SHARES_TOTAL, "4")?;
    }
    let claims: Vec<AllocatedClaim> = shares.iter().map(|s| s.claim.clone()).collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(namespace).await?;
    check_unprepared(ctx, &claims).await
}

const UNLIMITED_NAMESPACE: &str = "tessera-e2e-shares-unlimited";
/// More claims than the largest share count the N-shares modes allow per pod scenario here.
const UNLIMITED_PODS: usize = 6;

/// `unlimited`: six claims that ask for no memory and one asking 20Gi all get gpu-0.
pub async fn shares_unlimited(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    with_sharing(ctx, "unlimited", |node| unlimited_body(ctx, node)).await
}

async fn unlimited_body(ctx: &Ctx, node: String) -> anyhow::Result<()> {
    let namespace = UNLIMITED_NAMESPACE;
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    let on_gpu_0 = format!(
        "device.attributes[\"{}\"].minor == 0",
        tessera_api::names::DRIVER_NAME
    );
    create(
        ctx,
        namespace,
        &template(namespace, "any-part", None, Some(&on_gpu_0))?,
    )
    .await?;
    create(
        ctx,
        namespace,
        &template(namespace, "gpu-20gi", Some("20Gi"), Some(&on_gpu_0))?,
    )
    .await?;
    let mut shares = Vec::new();
    for i in 0..=UNLIMITED_PODS {
        let (name, template) = if i < UNLIMITED_PODS {
            (format!("part-{i}"), "any-part")
        } else {
            ("twenty".to_owned(), "gpu-20gi")
        };
        create(ctx, namespace, &pod(namespace, &name, &node, template)?).await?;
        shares.push(share_of(ctx, namespace, &name).await?);
    }
    one_device_of_node(&shares, &node)?;
    ensure!(
        shares[0].device == "gpu-0",
        "the claims got {}, their selector asks for minor 0",
        shares[0].device
    );
    for (i, share) in shares.iter().enumerate() {
        let want = if i < UNLIMITED_PODS { 0 } else { 20 * GIB };
        // A consumed capacity of zero may be written as "0" or left out.
        let memory = match share.consumed.get("memory") {
            None if want == 0 => 0,
            _ => consumed_bytes(share, "memory")?,
        };
        ensure!(
            memory == want,
            "pod {}: consumed {:?}, expected memory {want}",
            share.pod,
            share.consumed
        );
        ensure!(
            !share.consumed.contains_key("shares"),
            "pod {}: the unlimited mode publishes no shares capacity, consumed {:?}",
            share.pod,
            share.consumed
        );
        let env = check_running(ctx, namespace, share).await?;
        ensure_env(&env, &share.pod, ENV_MEMORY_LIMIT, &want.to_string())?;
        ensure!(
            !env.contains_key(ENV_SHARES),
            "pod {}: {ENV_SHARES} is set in the unlimited mode: {env:?}",
            share.pod
        );
    }
    ctx.say(format!(
        "{} claims share {node}/gpu-0 in the unlimited mode",
        shares.len()
    ));
    let claims: Vec<AllocatedClaim> = shares.iter().map(|s| s.claim.clone()).collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(namespace).await?;
    check_unprepared(ctx, &claims).await
}

const MIG_NAMESPACE: &str = "tessera-e2e-shares-mig";
const MIG_CLASS: &str = "mig-1g.10gb.gpu.tessera.dev";

/// The MIG node in `2`-shares mode: two claims of a 1g.10gb MIG device share one, the third gets
/// another (the first has no share left).
pub async fn shares_mig(ctx: &Ctx) -> anyhow::Result<ScenarioOutcome> {
    let published = ctx.published().await?;
    if !published
        .nodes()
        .iter()
        .any(|n| published.on_node(n).any(|d| d.profile() == Some("1g.10gb")))
    {
        return Ok(ScenarioOutcome::Skipped(
            "no node publishes 1g.10gb MIG devices (the local cluster runs hgx-a100-mig on one node)"
                .to_owned(),
        ));
    }
    with_sharing_on(ctx, SharedNode::Mig, "2", |node| mig_body(ctx, node)).await
}

async fn mig_body(ctx: &Ctx, node: String) -> anyhow::Result<()> {
    let namespace = MIG_NAMESPACE;
    ctx.fresh_namespace(namespace).await?;
    create_namespace(&ctx.client, namespace).await?;
    let one_slice: ResourceClaimTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": namespace, "name": "one-slice"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": MIG_CLASS}},
        ]}}},
    }))?;
    create(ctx, namespace, &one_slice).await?;
    let mut shares = Vec::new();
    for i in 0..3 {
        let name = format!("slice-{i}");
        create(ctx, namespace, &pod(namespace, &name, &node, "one-slice")?).await?;
        shares.push(share_of(ctx, namespace, &name).await?);
    }
    let published = ctx.published().await?;
    let third = shares.pop().context("three shares")?;
    one_device_of_node(&shares, &node)?;
    let device = published
        .get(&node, &shares[0].device)
        .with_context(|| format!("{node}/{} is not published", shares[0].device))?;
    ensure!(
        device.is_mig() && device.profile() == Some("1g.10gb"),
        "the shared device {} is not a 1g.10gb MIG device",
        device.name
    );
    ensure!(
        third.device != shares[0].device,
        "the third claim got {} too, whose two shares were taken",
        third.device
    );
    ctx.say(format!(
        "two claims share MIG device {node}/{}, the third got {}",
        shares[0].device, third.device
    ));
    shares.push(third);
    for share in &shares {
        ensure!(
            consumed_bytes(share, "shares")? == 1,
            "pod {}: consumed {:?}, expected one share",
            share.pod,
            share.consumed
        );
        let env = check_running(ctx, namespace, share).await?;
        ensure_env(&env, &share.pod, ENV_SHARES, "1")?;
        ensure_env(&env, &share.pod, ENV_SHARES_TOTAL, "2")?;
    }
    let claims: Vec<AllocatedClaim> = shares.iter().map(|s| s.claim.clone()).collect();
    check_prepared(ctx, &claims).await?;
    ctx.delete_namespace(namespace).await?;
    check_unprepared(ctx, &claims).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_capabilities_compare_by_major_and_minor() {
        assert_eq!(major_minor("8.0"), Some((8, 0)));
        assert_eq!(major_minor("9.0.0"), Some((9, 0)));
        assert_eq!(major_minor("x"), None);
        assert!(major_minor("8.0").unwrap() > (7, 5));
        assert!(major_minor("7.5").unwrap() <= (7, 5));
    }
}
