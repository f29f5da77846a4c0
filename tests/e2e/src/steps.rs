//! The steps scenarios are made of: wait for a pod's claims to be allocated, for the pod to run,
//! check what its containers received, check the plugin prepared and later unprepared its
//! claims. Every failure says what was expected and what was seen.

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams};

use crate::checker;
use crate::claims::{AllocatedDevice, AllocationStatus, container_claims, get_claim, pod_claims};
use crate::context::Ctx;
use crate::devices::{Published, PublishedDevice, parse_quantity};
use crate::objects;
use crate::observer::{ClaimOnNode, ContainerView};
use crate::wait::{Progress, until};

/// A pod claim and its allocation.
#[derive(Debug, Clone)]
pub struct AllocatedClaim {
    /// The pod's entry name (`spec.resourceClaims[].name`).
    pub entry: String,
    pub claim: ResourceClaim,
    pub allocation: AllocationStatus,
}

impl AllocatedClaim {
    pub fn name(&self) -> &str {
        self.claim.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.claim.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.claim.metadata.uid.as_deref().unwrap_or_default()
    }

    /// The allocation's node, required.
    pub fn node(&self) -> anyhow::Result<&str> {
        self.allocation.node.as_deref().with_context(|| {
            format!(
                "the allocation of claim {}/{} names no single node",
                self.namespace(),
                self.name()
            )
        })
    }

    /// The published devices of the allocation, in allocation order.
    pub fn devices<'a>(
        &self,
        published: &'a Published,
    ) -> anyhow::Result<Vec<&'a PublishedDevice>> {
        self.allocation
            .ours()
            .map(|d| {
                published.get(&d.pool, &d.device).with_context(|| {
                    format!(
                        "claim {}/{} was allocated device {}/{}, which no ResourceSlice publishes",
                        self.namespace(),
                        self.name(),
                        d.pool,
                        d.device
                    )
                })
            })
            .collect()
    }

    /// `gpu-4 NUMA 1 island …` lines, one per device.
    pub fn describe(&self, published: &Published) -> String {
        let mut lines = vec![format!(
            "claim {} on {}:",
            self.name(),
            self.allocation.node.as_deref().unwrap_or("<no node>")
        )];
        for device in self.allocation.ours() {
            let text = match published.get(&device.pool, &device.device) {
                Some(d) => d.summary(),
                None => format!("{} (not published)", device.device),
            };
            lines.push(format!("  {:<14} {text}", device.request));
        }
        lines.join("\n")
    }
}

/// Waits until every claim of `pod` exists and is allocated.
pub async fn wait_allocated(
    ctx: &Ctx,
    namespace: &str,
    pod: &str,
) -> anyhow::Result<Vec<AllocatedClaim>> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("the claims of pod {namespace}/{pod} to be allocated"),
        ctx.timeouts.allocate,
        || async {
            let current = pods
                .get(pod)
                .await
                .with_context(|| format!("cannot read pod {namespace}/{pod}"))?;
            let mut allocated = Vec::new();
            for entry in pod_claims(&current) {
                let Some(name) = entry.claim_name else {
                    return Ok(Progress::Waiting(format!(
                        "claim `{}` not generated yet; pod: {}",
                        entry.entry,
                        pod_summary(&current)
                    )));
                };
                let claim = get_claim(&ctx.client, namespace, &name).await?;
                let Some(allocation) = AllocationStatus::of(&claim) else {
                    return Ok(Progress::Waiting(format!(
                        "claim {name} not allocated; pod: {}",
                        pod_summary(&current)
                    )));
                };
                allocated.push(AllocatedClaim {
                    entry: entry.entry,
                    claim,
                    allocation,
                });
            }
            Ok(Progress::Done(allocated))
        },
    )
    .await
}

/// Waits until `pod` is Running (every container started).
pub async fn wait_running(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<Pod> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    until(
        &format!("pod {namespace}/{pod} to be Running"),
        ctx.timeouts.run,
        || async {
            let current = pods.get(pod).await?;
            let phase = current
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            Ok(match phase {
                "Running" => Progress::Done(current),
                "Failed" | "Succeeded" => {
                    bail!("pod {namespace}/{pod} ended: {}", pod_summary(&current))
                }
                _ => Progress::Waiting(pod_summary(&current)),
            })
        },
    )
    .await
}

/// Phase, node, waiting reasons and unschedulable messages of a pod, on one line.
pub fn pod_summary(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let mut parts = vec![format!(
        "phase {}",
        status.and_then(|s| s.phase.as_deref()).unwrap_or("<none>")
    )];
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        parts.push(format!("node {node}"));
    }
    if let Some(gates) = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref())
        && !gates.is_empty()
    {
        let names: Vec<&str> = gates.iter().map(|g| g.name.as_str()).collect();
        parts.push(format!("gated by {}", names.join(", ")));
    }
    for condition in status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        if condition.status == "False" && condition.message.is_some() {
            parts.push(format!(
                "{}: {} {}",
                condition.type_,
                condition.reason.as_deref().unwrap_or(""),
                condition.message.as_deref().unwrap_or("")
            ));
        }
    }
    for container in status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(waiting) = container.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            parts.push(format!(
                "container {} waiting: {}",
                container.name,
                waiting.reason.as_deref().unwrap_or("")
            ));
        }
    }
    parts.join("; ")
}

/// The devices a container using `uses` (claim entry, optional request) gets, with the claim
/// configs that apply to each.
fn container_devices<'a>(
    pod: &Pod,
    uses: &[(String, Option<String>)],
    claims: &'a [AllocatedClaim],
    published: &'a Published,
) -> anyhow::Result<Vec<(&'a PublishedDevice, Vec<&'a serde_json::Value>)>> {
    let mut devices = Vec::new();
    for (entry, request) in uses {
        let claim = claims.iter().find(|c| &c.entry == entry).with_context(|| {
            format!(
                "pod {} uses claim entry `{entry}`, which has no allocated claim",
                pod.metadata.name.as_deref().unwrap_or_default()
            )
        })?;
        let matches_request = |d: &AllocatedDevice| match request {
            Some(r) => d.request == *r || d.request.starts_with(&format!("{r}/")),
            None => true,
        };
        for device in claim.allocation.ours().filter(|d| matches_request(d)) {
            let found = published
                .get(&device.pool, &device.device)
                .with_context(|| {
                    format!(
                        "allocated device {}/{} is not published",
                        device.pool, device.device
                    )
                })?;
            let parent_request = device.request.split('/').next().unwrap_or_default();
            let configs = claim
                .allocation
                .config
                .iter()
                // NVIDIA's driver name too: with no NVIDIA driver in the cluster, the plugin takes its
                // configs (`tessera_api::nvidia`).
                .filter(|c| {
                    c.driver == device.driver || c.driver == tessera_api::nvidia::NVIDIA_DRIVER_NAME
                })
                .filter(|c| {
                    c.requests.is_empty()
                        || c.requests
                            .iter()
                            .any(|r| *r == device.request || *r == parent_request)
                })
                .map(|c| &c.parameters)
                .collect();
            devices.push((found, configs));
        }
    }
    Ok(devices)
}

/// What the checker in a container using `uses` must report: the devices' nodes and UUIDs,
/// and MPS settings when a config of the claim shares them through MPS (the last config wins,
/// as in the plugin).
pub fn expected_check(
    pod: &Pod,
    uses: &[(String, Option<String>)],
    claims: &[AllocatedClaim],
    published: &Published,
) -> anyhow::Result<checker::Expected> {
    let mut expected = checker::Expected::default();
    for (device, configs) in container_devices(pod, uses, claims, published)? {
        let minor = device
            .minor()
            .with_context(|| format!("device {} has no minor attribute", device.name))?;
        expected.gpu_minors.insert(minor);
        if device.is_mig() {
            expected.mig_devices += 1;
        }
        if let Some(uuid) = device.uuid() {
            expected.uuids.insert(uuid.to_owned());
        }
        let sharing = configs.iter().rev().find_map(|c| c.get("sharing"));
        let strategy = sharing
            .and_then(|s| s.get("strategy"))
            .and_then(|s| s.as_str());
        if strategy.is_some_and(|s| s.eq_ignore_ascii_case("mps")) {
            // Ours (`mps`) or NVIDIA's (`mpsConfig`), which the plugin reads the same way.
            let mps = sharing.and_then(|s| s.get("mps").or_else(|| s.get("mpsConfig")));
            let percentage = mps
                .and_then(|m| m.get("defaultActiveThreadPercentage"))
                .and_then(|p| p.as_u64())
                .and_then(|p| u32::try_from(p).ok());
            let pinned = mps
                .and_then(|m| m.get("defaultPinnedDeviceMemoryLimit"))
                .and_then(|q| q.as_str())
                .and_then(parse_quantity);
            expected.mps = Some(checker::ExpectedMps {
                active_thread_percentage: percentage,
                pinned_memory_bytes: pinned,
            });
        }
    }
    Ok(expected)
}

/// A pod without a claim on `node` (which has GPUs and the driver): its checker must see none of
/// the GPUs' device nodes, no driver files, no CUDA, no nvidia-smi, no GPU environment.
pub async fn check_unclaimed_pod(ctx: &Ctx, node: &str) -> anyhow::Result<()> {
    let namespace = "tessera-e2e-no-claim";
    ctx.fresh_namespace(namespace).await?;
    objects::create_namespace(&ctx.client, namespace).await?;
    let pod = objects::plain_pod(namespace, "pod", node)?;
    Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .with_context(|| format!("cannot create pod {namespace}/pod"))?;
    let running = wait_running(ctx, namespace, "pod").await?;
    let view = until(
        &format!("the checker's report of {namespace}/pod"),
        ctx.timeouts.run,
        || async {
            Ok(match ctx.observer.container_view(&running, "ctr").await? {
                Some(view) if view.check.is_some() => Progress::Done(view),
                _ => Progress::Waiting("no checker report in the log yet".to_owned()),
            })
        },
    )
    .await?;
    let report = view.check.as_ref().context("no checker report")?;
    checker::check_unclaimed_container(report).with_context(|| {
        format!(
            "pod {namespace}/pod without a claim on {node} ({})",
            view.source
        )
    })?;
    ctx.say(format!(
        "{namespace}/pod (no claim, on {node}): the checker sees no GPU device node, driver file, CUDA or nvidia-smi"
    ));
    ctx.delete_namespace(namespace).await?;
    Ok(())
}

/// For every container of `pod` that uses a claim: waits until the runtime saw it, then checks
/// that the CDI ids it got resolve (local cluster), that no variable narrows its GPUs, and (with
/// the in-container checker) that CUDA lists exactly the UUIDs of its allocated devices, of
/// every claim it uses.
pub async fn check_containers(
    ctx: &Ctx,
    pod: &Pod,
    claims: &[AllocatedClaim],
    published: &Published,
) -> anyhow::Result<()> {
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| c.name.clone())
        .collect();
    for container in containers {
        check_container(ctx, pod, &container, claims, published).await?;
    }
    Ok(())
}

/// [`check_containers`] for one container (nothing when it uses no claim).
async fn check_container(
    ctx: &Ctx,
    pod: &Pod,
    container: &str,
    claims: &[AllocatedClaim],
    published: &Published,
) -> anyhow::Result<()> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let uses = container_claims(pod, container);
    if uses.is_empty() {
        return Ok(());
    }
    let view = received_container(ctx, pod, container).await?;
    // No variable narrows what CUDA sees (it enumerates the injected device nodes: every claim's
    // of the container), and the toolkit's variable says `void` so its legacy hook adds nothing.
    ensure!(
        view.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some("void")
            && !view.env.contains_key("CUDA_VISIBLE_DEVICES"),
        "container {pod_name}/{container}: GPU environment {:?}, expected NVIDIA_VISIBLE_DEVICES=void and no CUDA_VISIBLE_DEVICES (seen in {})",
        view.env,
        view.source
    );
    if ctx.observer.expects_checker() {
        let expected = expected_check(pod, &uses, claims, published)?;
        check_report(ctx, &view, &expected, &format!("{pod_name}/{container}"))?;
    }
    let ids = match &view.cdi_ids {
        Some(ids) => {
            ensure!(
                !ids.is_empty(),
                "container {pod_name}/{container} got no CDI devices ({})",
                view.source
            );
            format!("; CDI: {}", ids.join(" "))
        }
        None => String::new(),
    };
    ctx.say(format!(
        "{pod_name}/{container}: NVIDIA_VISIBLE_DEVICES={}{ids}",
        view.env
            .get("NVIDIA_VISIBLE_DEVICES")
            .map(String::as_str)
            .unwrap_or("")
    ));
    Ok(())
}

/// Waits until the runtime saw `container` of `pod` and it printed its GPU environment.
async fn received_container(
    ctx: &Ctx,
    pod: &Pod,
    container: &str,
) -> anyhow::Result<ContainerView> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    until(
        &format!("the runtime to receive container {pod_name}/{container}"),
        ctx.timeouts.run,
        || async {
            Ok(match ctx.observer.container_view(pod, container).await? {
                // The container prints the checker's report, then its GPU environment (a
                // claim container always has some): until that is there, it is still
                // printing.
                Some(view) if !view.env.is_empty() => Progress::Done(view),
                Some(_) => Progress::Waiting(
                    "the container is still printing (no GPU environment yet)".to_owned(),
                ),
                None => Progress::Waiting("no container record or output yet".to_owned()),
            })
        },
    )
    .await
}

/// The checker's report in `view` says what a container using the claim must see; `what` names
/// the container (`pod/container`).
fn check_report(
    ctx: &Ctx,
    view: &ContainerView,
    expected: &checker::Expected,
    what: &str,
) -> anyhow::Result<()> {
    let report = view.check.as_ref().with_context(|| {
        format!(
            "container {what} printed no tessera-gpu-check report ({}); the workload image must carry the checker",
            view.source
        )
    })?;
    checker::check_claim_container(report, expected)
        .with_context(|| format!("container {what}: the checker's report ({})", view.source))?;
    ctx.say(format!(
        "{what}: checker sees {} GPU node(s), {} driver file(s), CUDA devices {:?}{}",
        expected.gpu_minors.len(),
        report.driver_files.len(),
        expected.uuids,
        if expected.mps.is_some() {
            ", MPS daemon and limits"
        } else {
            ""
        }
    ));
    Ok(())
}

/// Checks that the plugin on each claim's node holds a CDI spec and a completed checkpoint
/// entry for it (local cluster; said to be unobservable elsewhere).
pub async fn check_prepared(ctx: &Ctx, claims: &[AllocatedClaim]) -> anyhow::Result<()> {
    for claim in claims {
        let state = ctx.observer.claim_on_node(claim.node()?, claim.uid())?;
        ensure!(
            state.is_prepared(),
            "claim {}/{} runs but the plugin on {} does not hold it as prepared: {}",
            claim.namespace(),
            claim.name(),
            claim.node()?,
            state.describe()
        );
        if let ClaimOnNode::Unobservable(why) = &state {
            ctx.say(format!("(prepared state not checked: {why})"));
        }
    }
    Ok(())
}

/// Deletes `pods` of `namespace`, waits until they are gone, then until the plugin has
/// unprepared every one of `claims` (CDI spec removed, checkpoint entry gone).
pub async fn delete_pods_and_check_unprepared(
    ctx: &Ctx,
    namespace: &str,
    pods: &[String],
    claims: &[AllocatedClaim],
) -> anyhow::Result<()> {
    let api = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    for pod in pods {
        match api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                return Err(error).with_context(|| format!("cannot delete pod {namespace}/{pod}"));
            }
        }
    }
    for pod in pods {
        until(
            &format!("pod {namespace}/{pod} to be deleted"),
            ctx.timeouts.delete,
            || async {
                Ok(match api.get_opt(pod).await? {
                    None => Progress::Done(()),
                    Some(current) => Progress::Waiting(pod_summary(&current)),
                })
            },
        )
        .await?;
    }
    check_unprepared(ctx, claims).await
}

/// Waits until the plugin holds nothing for `claims`.
pub async fn check_unprepared(ctx: &Ctx, claims: &[AllocatedClaim]) -> anyhow::Result<()> {
    for claim in claims {
        let node = claim.node()?;
        let state = until(
            &format!(
                "the plugin on {node} to unprepare claim {}/{}",
                claim.namespace(),
                claim.name()
            ),
            ctx.timeouts.delete,
            || async {
                let state = ctx.observer.claim_on_node(node, claim.uid())?;
                Ok(if state.is_gone() {
                    Progress::Done(state)
                } else {
                    Progress::Waiting(state.describe())
                })
            },
        )
        .await?;
        if let ClaimOnNode::Unobservable(why) = state {
            ctx.say(format!("(unprepare not checked: {why})"));
        }
    }
    if ctx.observer.is_local() && !claims.is_empty() {
        ctx.say(format!(
            "unprepared: {} (CDI specs removed, checkpoint entries gone)",
            claims
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// Events about `pod`, oldest first.
pub async fn pod_events(ctx: &Ctx, namespace: &str, pod: &str) -> anyhow::Result<Vec<Event>> {
    let mut events = Api::<Event>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=Pod,involvedObject.name={pod}"
        )))
        .await
        .with_context(|| format!("cannot list events of pod {namespace}/{pod}"))?
        .items;
    events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    Ok(events)
}

/// The pod names of a list, for the delete step.
pub fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}
