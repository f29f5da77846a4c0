//! `tessera explain`: why a claim can or cannot be allocated, device by device (`--claim`: the
//! claim as written, as kube-scheduler's allocator sees it), and what the topology-aware controller
//! does with a pod (`--pod`: `tessera-placement`'s decision, the very function the controller
//! calls, on objects read from files).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize as _, Serialize};
use tessera_allocator::{
    AllocateOptions, AllocatedState, Allocation, DeviceIndex, Outcome, PlacementMode,
    Unsatisfiable, claim_name,
};
use tessera_placement::extended::extended_resource_claim_owner;
use tessera_placement::{ClusterObjects, Settings};

mod group;
mod pod;

pub use crate::output::OutputFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// What kube-scheduler would pick.
    FirstFit,
    /// Tessera's topology score (docs/user-guide.md, "Well-connected multi-GPU claims").
    TopologyAware,
}

impl From<Mode> for PlacementMode {
    fn from(mode: Mode) -> PlacementMode {
        match mode {
            Mode::FirstFit => PlacementMode::FirstFit,
            Mode::TopologyAware => PlacementMode::TopologyAware,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["claim", "pod", "target"])))]
pub struct ExplainArgs {
    /// What to explain, kubectl style: `pod/NAME` or `claim/NAME` (`resourceclaim/NAME`), in
    /// `--namespace`; the same as `--pod` / `--claim`.
    #[arg(value_name = "TYPE/NAME", conflicts_with_all = ["claim", "pod"])]
    pub target: Option<String>,

    /// The namespace of `TYPE/NAME` (and of a `--pod`/`--claim` given without one).
    #[arg(
        short = 'n',
        long,
        env = "TESSERA_NAMESPACE",
        default_value = "default"
    )]
    pub namespace: String,

    /// Files or directories of YAML/JSON: ResourceSlices, DeviceClasses, ResourceClaims (allocated
    /// ones count as in use), Nodes (for a claim optional: without them the nodes are those named
    /// by the slices; for a pod required), and for `--pod` the Pods (bound ones count on their
    /// node) and ResourceClaimTemplates. `List` objects are unpacked; other kinds are skipped.
    /// Without it, the same objects are read from the live cluster (kubeconfig).
    #[arg(long, env = "TESSERA_OBJECTS", num_args = 1.., value_delimiter = ',')]
    pub objects: Vec<PathBuf>,

    #[command(flatten)]
    pub cluster: crate::live::ClusterArgs,

    /// The claim to explain, as NAMESPACE/NAME (a claim without a namespace is in `default`):
    /// allocated as written, as kube-scheduler's allocator would (a topology-managed device's
    /// taint is not tolerated unless the claim tolerates it).
    #[arg(long, env = "TESSERA_CLAIM")]
    pub claim: Option<String>,

    /// The pod to explain, as NAMESPACE/NAME: what tessera-controller does with it — the same
    /// decision, from the same code (its claims placed jointly on topology-managed devices of
    /// one node, nodes filtered by cordon, selectors, taints and resources, or why not).
    #[arg(long, env = "TESSERA_POD", conflicts_with = "node")]
    pub pod: Option<String>,

    /// Only this node (with `--claim`); without it, the node the mode would pick.
    #[arg(long, env = "TESSERA_NODE")]
    pub node: Option<String>,

    /// How devices and nodes are chosen [default: first-fit for a claim, topology-aware (the
    /// controller's) for a pod].
    #[arg(long, env = "TESSERA_MODE", value_enum)]
    pub mode: Option<Mode>,

    /// The scheduling gate the controller places pods for (its `--gate-name`).
    #[arg(long, env = "TESSERA_GATE_NAME", default_value = tessera_api::names::TOPOLOGY_AWARE_GATE)]
    pub gate_name: String,

    /// Search steps per node before giving up.
    #[arg(long, env = "TESSERA_STEP_BUDGET", default_value_t = tessera_allocator::DEFAULT_STEP_BUDGET)]
    pub step_budget: u64,

    #[command(flatten)]
    pub output: crate::output::Output,
}

/// The objects found in the input files.
#[derive(Debug, Default)]
pub struct Objects {
    pub cluster: ClusterObjects,
    /// Upstream PodGroups (`scheduling.k8s.io/v1beta1`) that gangs name.
    pub pod_groups: Vec<k8s_openapi::api::scheduling::v1beta1::PodGroup>,
    /// Kinds that were skipped, with where they came from.
    pub skipped: Vec<String>,
    /// Listed from the live cluster (not read from `--objects` files): what an error's hint
    /// suggests differs.
    pub live: bool,
}

impl Objects {
    /// How to add a missing object: where these objects came from.
    pub fn missing_hint(&self, what: &str) -> String {
        if self.live {
            format!(
                "the cluster has no {what} of that name (the CLI lists every namespace live; check \
                 the name and --namespace, or the kubeconfig's context)"
            )
        } else {
            format!("pass the file that holds the {what} with --objects")
        }
    }
}

impl Objects {
    /// Reads every file under `paths` (directories recursively, `.yaml`, `.yml` and `.json` files).
    pub fn load(paths: &[PathBuf]) -> anyhow::Result<Objects> {
        let mut objects = Objects::default();
        for path in paths {
            objects.load_path(path)?;
        }
        Ok(objects)
    }

    fn load_path(&mut self, path: &Path) -> anyhow::Result<()> {
        let meta = std::fs::metadata(path).with_context(|| format!("read {}", path.display()))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("list directory {}", path.display()))?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .with_context(|| format!("list directory {}", path.display()))?;
            entries.sort();
            for entry in entries {
                let is_object_file = entry
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
                if entry.is_dir() || is_object_file {
                    self.load_path(&entry)?;
                }
            }
            return Ok(());
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = serde_yaml::Value::deserialize(document)
                .with_context(|| format!("{}: document {}: not YAML", path.display(), index + 1))?;
            self.add(
                value,
                &format!("{} (document {})", path.display(), index + 1),
            )?;
        }
        Ok(())
    }

    fn add(&mut self, value: serde_yaml::Value, origin: &str) -> anyhow::Result<()> {
        if value.is_null() {
            return Ok(());
        }
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_owned();
        let parse = |what: &str| format!("{origin}: not a valid {what}");
        let cluster = &mut self.cluster;
        match kind.as_str() {
            "ResourceSlice" => cluster
                .slices
                .push(serde_yaml::from_value(value).with_context(|| parse("ResourceSlice"))?),
            "DeviceClass" => cluster
                .classes
                .push(serde_yaml::from_value(value).with_context(|| parse("DeviceClass"))?),
            "ResourceClaim" => cluster
                .claims
                .push(serde_yaml::from_value(value).with_context(|| parse("ResourceClaim"))?),
            "ResourceClaimTemplate" => cluster.templates.push(
                serde_yaml::from_value(value).with_context(|| parse("ResourceClaimTemplate"))?,
            ),
            "Node" => cluster
                .nodes
                .push(serde_yaml::from_value(value).with_context(|| parse("Node"))?),
            "Pod" => cluster
                .pods
                .push(serde_yaml::from_value(value).with_context(|| parse("Pod"))?),
            "PodGroup" => self
                .pod_groups
                .push(serde_yaml::from_value(value).with_context(|| parse("PodGroup"))?),
            "List"
            | "ResourceSliceList"
            | "DeviceClassList"
            | "ResourceClaimList"
            | "ResourceClaimTemplateList"
            | "NodeList"
            | "PodList"
            | "PodGroupList" => {
                let items = value
                    .get("items")
                    .and_then(|i| i.as_sequence())
                    .cloned()
                    .unwrap_or_default();
                for (i, item) in items.into_iter().enumerate() {
                    self.add(item, &format!("{origin} item {}", i + 1))?;
                }
            }
            "" => bail!("{origin}: object has no kind; add `kind:` and `apiVersion:`"),
            other => self.skipped.push(format!("{other} in {origin}")),
        }
        Ok(())
    }
}

/// What `-o json` prints.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    node: Option<&'a str>,
    allocation: Option<&'a k8s_openapi::api::resource::v1::AllocationResult>,
    unsatisfiable: Vec<JsonNode>,
}

#[derive(Debug, Serialize)]
struct JsonNode {
    node: String,
    reasons: Vec<String>,
}

fn qualified(claim: &ResourceClaim) -> String {
    let name = claim_name(claim);
    if name.contains('/') {
        name
    } else {
        format!("default/{name}")
    }
}

/// `NAMESPACE/NAME`, `<namespace>/NAME` for a bare name.
fn namespaced(key: &str, namespace: &str) -> String {
    if key.contains('/') {
        key.to_owned()
    } else {
        format!("{namespace}/{key}")
    }
}

/// The pod and claim to explain, from `--pod`/`--claim` or `TYPE/NAME`.
fn targets(args: &ExplainArgs) -> anyhow::Result<(Option<String>, Option<String>)> {
    let Some(target) = &args.target else {
        return Ok((args.pod.clone(), args.claim.clone()));
    };
    let Some((kind, name)) = target.split_once('/') else {
        bail!("`{target}`: name what to explain as pod/NAME or claim/NAME");
    };
    let name = format!("{}/{name}", args.namespace);
    match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" | "po" => Ok((Some(name), None)),
        "claim" | "claims" | "resourceclaim" | "resourceclaims" => Ok((None, Some(name))),
        other => bail!("`{target}`: cannot explain a `{other}`; name a pod/NAME or a claim/NAME"),
    }
}

pub fn run(args: &ExplainArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let (pod, claim) = targets(args)?;
    let objects = crate::live::objects(&args.objects, &args.cluster)?;
    let namespaced = |key: &str| namespaced(key, &args.namespace);
    match (&pod, &claim) {
        (Some(pod), _) => {
            let mut settings = Settings::new(&args.gate_name);
            settings.options.step_budget = args.step_budget;
            if let Some(mode) = args.mode {
                settings.options.mode = mode.into();
            }
            pod::explain(
                &objects,
                &namespaced(pod),
                &settings,
                args.output.format,
                out,
            )
        }
        (None, Some(claim)) => explain_claim(args, objects, &namespaced(claim), out),
        (None, None) => bail!("name a claim (--claim) or a pod (--pod) to explain"),
    }
}

fn explain_claim(
    args: &ExplainArgs,
    objects: Objects,
    wanted: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let hint = objects.missing_hint("claim");
    let cluster = objects.cluster;
    let Some(target) = cluster.claims.iter().find(|c| qualified(c) == wanted) else {
        let known: Vec<String> = cluster.claims.iter().map(qualified).collect();
        bail!(
            "claim {wanted} is not among the objects (claims found: {}); {}",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
            hint
        );
    };
    let mut target = target.clone();
    let previous = target.status.as_mut().and_then(|s| s.allocation.take());
    let state =
        AllocatedState::from_claims(cluster.claims.iter().filter(|c| qualified(c) != wanted))?;
    let inventory = DeviceIndex::from_nodes(cluster.slices, cluster.classes, &cluster.nodes);
    let options = AllocateOptions {
        mode: args.mode.unwrap_or(Mode::FirstFit).into(),
        step_budget: args.step_budget,
        explain: true,
        numa: Default::default(),
    };
    let outcome = inventory.allocate(
        std::slice::from_ref(&target),
        &state,
        args.node.as_deref(),
        &options,
    )?;
    match args.output.format {
        OutputFormat::Json => write_json(out, &outcome),
        OutputFormat::Text => {
            if let Some(pod) = extended_resource_claim_owner(&target) {
                writeln!(
                    out,
                    "note: claim {wanted} is the one kube-scheduler made for the extended resources of pod {pod} \
                     (its requests are the pod's containers' resources, its class the one naming each resource)"
                )?;
            }
            if previous.is_some() {
                writeln!(
                    out,
                    "note: claim {wanted} is already allocated; explaining a fresh allocation"
                )?;
            }
            for skipped in &objects.skipped {
                writeln!(out, "note: skipped {skipped}")?;
            }
            match &outcome {
                Outcome::Allocated(a) => write_allocation(out, wanted, options.mode, a),
                Outcome::Unsatisfiable(u) => write_unsatisfiable(out, wanted, options.mode, u),
            }
        }
    }
}

fn write_json(out: &mut impl Write, outcome: &Outcome) -> anyhow::Result<()> {
    let report = match outcome {
        Outcome::Allocated(a) => JsonReport {
            node: Some(&a.node),
            allocation: Some(&a.claims[0].result),
            unsatisfiable: Vec::new(),
        },
        Outcome::Unsatisfiable(u) => JsonReport {
            node: None,
            allocation: None,
            unsatisfiable: u
                .nodes
                .iter()
                .map(|n| JsonNode {
                    node: n.node.clone(),
                    reasons: n.reason_lines(),
                })
                .collect(),
        },
    };
    serde_json::to_writer_pretty(&mut *out, &report)?;
    writeln!(out)?;
    Ok(())
}

fn write_allocation(
    out: &mut impl Write,
    claim: &str,
    mode: PlacementMode,
    a: &Allocation,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "claim {claim} can be allocated on node {} ({mode}):",
        a.node
    )?;
    let result = &a.claims[0].result;
    let devices = result.devices.as_ref();
    for r in devices
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
    {
        writeln!(out, "  {}", result_line(r))?;
    }
    for c in devices
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default()
    {
        let requests = c
            .requests
            .as_deref()
            .map(|r| r.join(", "))
            .unwrap_or_else(|| "all requests".into());
        let driver = c.opaque.as_ref().map(|o| o.driver.as_str()).unwrap_or("?");
        writeln!(
            out,
            "  config {} for {requests} (driver {driver})",
            c.source
        )?;
    }
    writeln!(out, "  score: {}", a.score)?;
    if a.truncated {
        writeln!(
            out,
            "  note: the search stopped at its step budget; a better placement may exist"
        )?;
    }
    Ok(())
}

fn write_unsatisfiable(
    out: &mut impl Write,
    claim: &str,
    mode: PlacementMode,
    u: &Unsatisfiable,
) -> anyhow::Result<()> {
    writeln!(out, "claim {claim} cannot be allocated ({mode}):")?;
    write!(out, "{u}")?;
    Ok(())
}

pub(crate) fn result_line(
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> String {
    let mut extras = Vec::new();
    if r.admin_access == Some(true) {
        extras.push("admin access".to_owned());
    }
    if let Some(share) = &r.share_id {
        extras.push(format!("share {share}"));
    }
    for (name, q) in r.consumed_capacity.iter().flatten() {
        extras.push(format!("{name}={}", q.0));
    }
    let extras = if extras.is_empty() {
        String::new()
    } else {
        format!(" ({})", extras.join(", "))
    };
    format!(
        "request {} -> {}/{}/{}{extras}",
        r.request, r.driver, r.pool, r.device
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_for_a_missing_object_depends_on_where_the_objects_came_from() {
        let files = Objects::default();
        assert_eq!(
            files.missing_hint("pod"),
            "pass the file that holds the pod with --objects"
        );
        let live = Objects {
            live: true,
            ..Objects::default()
        };
        let hint = live.missing_hint("pod");
        assert!(!hint.contains("--objects"), "{hint}");
        assert!(hint.contains("--namespace"), "{hint}");
    }
}
