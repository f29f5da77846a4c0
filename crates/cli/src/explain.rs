//! `tessera explain`: why a claim can or cannot be allocated, device by device (`--claim`: the
//! claim as written, as kube-scheduler's allocator sees it), and what the topology-aware controller
//! does with a pod (`--pod`: `tessera-placement`'s decision, the very function the controller
//! calls, on objects read from files).

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use tessera_allocator::{AllocateOptions, PlacementMode};
use tessera_placement::Settings;

mod claim;
mod domain;
mod group;
mod pod;

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
        (None, Some(claim)) => {
            let options = AllocateOptions {
                mode: args.mode.unwrap_or(Mode::FirstFit).into(),
                step_budget: args.step_budget,
                explain: true,
                numa: Default::default(),
            };
            let node = args.node.as_deref();
            let claim = namespaced(claim);
            let format = args.output.format;
            claim::explain(
                objects,
                &claim,
                &options,
                node,
                &args.gate_name,
                format,
                out,
            )
        }
        (None, None) => bail!("name a claim (--claim) or a pod (--pod) to explain"),
    }
}
