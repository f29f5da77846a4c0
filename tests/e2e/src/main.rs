//! `tessera-e2e`: Tessera's end-to-end scenarios against a running cluster — the local one of
//! tests/cluster (with the processes of tests/e2e/local-up) or kind (deploy/kind). Run it through
//! `tests/e2e/run`, which builds it. See tests/e2e/README.md.
//!
//! Modules: `wait` (polling with a deadline), `envfile`, `local` (the local cluster's layout),
//! `context` (what every scenario works with), `manifest` (examples read and applied), `objects`
//! (claims and pods the scenarios build), `claims` and `devices` (what was allocated, what was
//! published), `cdi_view` and `observer` (what reached the container runtime), `checker` (the
//! in-container checker's report), `compare` (two allocations side by side), `plugins` (killing and
//! restarting plugins), `scrape` (`/metrics`), `stand_in` (another driver's kubelet plugin), `steps`
//! (the steps scenarios are made of), `dump` (what a failure prints), `scenarios`.

mod cdi_view;
mod checker;
mod claims;
mod compare;
mod context;
mod devices;
mod dump;
mod envfile;
mod local;
mod manifest;
mod objects;
mod observer;
mod plugins;
mod scenarios;
mod scrape;
mod stand_in;
mod steps;
mod wait;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};

use crate::context::{Ctx, Timeouts};
use crate::local::{Install, LocalCluster};
use crate::observer::RuntimeObserver;
use crate::plugins::PluginControl;
use crate::scenarios::ScenarioOutcome;

/// Tessera's end-to-end scenarios, against the local cluster (tests/cluster + tests/e2e/local-up)
/// or a kind cluster (deploy/kind).
#[derive(Debug, Parser)]
#[command(name = "tessera-e2e", max_term_width = 100)]
struct Args {
    /// Kubeconfig of the cluster (admin). Default: the env file's, else $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// The local cluster's env file (DIR/env, written by tests/cluster/up); implies --cluster local.
    #[arg(long, env = "TESSERA_E2E_ENV_FILE")]
    env_file: Option<PathBuf>,

    /// Which kind of cluster: decides where the suite sees what reached the container runtime.
    #[arg(long, env = "TESSERA_E2E_CLUSTER", value_enum)]
    cluster: Option<ClusterKind>,

    /// Namespace of the chart's pods (kind: plugin restarts and log tails).
    #[arg(long, env = "TESSERA_NAMESPACE", default_value = "tessera-system")]
    namespace: String,

    /// The deploy/examples directory.
    #[arg(long, env = "TESSERA_E2E_EXAMPLES", default_value = "deploy/examples")]
    examples: PathBuf,

    /// Run only these scenarios (repeatable); default: all. `--list` shows them.
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,

    /// Leave these scenarios out (repeatable): those that need another cluster layout.
    #[arg(long = "except", value_name = "NAME")]
    except: Vec<String>,

    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,

    /// Multiply every timeout (slow machines).
    #[arg(long, env = "TESSERA_E2E_TIMEOUT_SCALE", default_value_t = 1.0)]
    timeout_scale: f64,

    /// Treat a skipped scenario as a failure (CI: the cluster is known to have everything).
    #[arg(long)]
    no_skip: bool,

    /// Stop at the first failing scenario.
    #[arg(long)]
    fail_fast: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClusterKind {
    /// tests/cluster: the plugin's files on this machine; containers' output (containerd) or the
    /// fake CRI's records.
    Local,
    /// kind: containers' output, plugin pods of the chart.
    Kind,
}

/// Each scenario's overall limit (its own waits are shorter; this catches a hang).
const SCENARIO_LIMIT: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list {
        for scenario in scenarios::all() {
            println!("{:<22} {}", scenario.name, scenario.about);
        }
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tessera-e2e: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("tessera-e2e: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig and no usable $KUBECONFIG or ~/.kube/config")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

async fn build_context(args: &Args) -> anyhow::Result<Ctx> {
    let kind = match (args.cluster, &args.env_file) {
        (Some(kind), _) => kind,
        (None, Some(_)) => ClusterKind::Local,
        (None, None) => bail!(
            "say which cluster this is: --env-file DIR/env for the local cluster (tests/e2e/local-up prints it), \
             or --cluster kind (deploy/kind/e2e sets it)"
        ),
    };
    let local = match (kind, &args.env_file) {
        (ClusterKind::Local, Some(env_file)) => Some(LocalCluster::read(env_file)?),
        (ClusterKind::Local, None) => bail!("--cluster local needs --env-file DIR/env"),
        (ClusterKind::Kind, _) => None,
    };
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| local.as_ref().map(|l| l.kubeconfig.clone()));
    let client = client(kubeconfig.as_deref()).await?;
    let (observer, plugins) = match local {
        Some(local) => {
            let plugins = match &local.install {
                Install::Helm { namespace } => PluginControl::Pods {
                    client: client.clone(),
                    namespace: namespace.clone(),
                },
                Install::Processes => PluginControl::Local(local.clone()),
            };
            (
                RuntimeObserver::Local {
                    local,
                    client: client.clone(),
                },
                plugins,
            )
        }
        None => (
            RuntimeObserver::Kind {
                client: client.clone(),
                namespace: args.namespace.clone(),
            },
            PluginControl::Pods {
                client: client.clone(),
                namespace: args.namespace.clone(),
            },
        ),
    };
    anyhow::ensure!(
        args.examples.is_dir(),
        "{} is not the deploy/examples directory (--examples)",
        args.examples.display()
    );
    let mut ctx = Ctx::new(
        client,
        observer,
        plugins,
        Timeouts::scaled(args.timeout_scale),
        args.examples.clone(),
    );
    ctx.kubeconfig = kubeconfig;
    Ok(ctx)
}

/// Prints what the suite runs against; fails early when nothing is published.
async fn preflight(ctx: &Ctx) -> anyhow::Result<()> {
    let version = ctx
        .client
        .apiserver_version()
        .await
        .context("cannot reach the API server")?;
    let published = ctx.published().await?;
    let managed = ctx.managed_nodes().await?;
    println!(
        "cluster: Kubernetes {} ({}), {}",
        version.git_version,
        if ctx.observer.is_local() {
            "local cluster"
        } else {
            "kind"
        },
        if managed.is_empty() {
            "no topology-managed node".to_owned()
        } else {
            format!("managed: {}", managed.join(", "))
        }
    );
    for node in published.nodes() {
        println!(
            "  {node}: {} devices ({} whole GPUs)",
            published.on_node(&node).count(),
            published.whole_gpus(&node).len()
        );
    }
    anyhow::ensure!(
        !published.is_empty(),
        "no node publishes gpu.tessera.dev devices: are the node plugins running? (tests/e2e/local-up, or deploy/kind/install)"
    );
    Ok(())
}

enum Verdict {
    Pass,
    Skip(String),
    Fail(String),
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let selected = scenarios::select(&args.scenarios, &args.except)?;
    let ctx = build_context(&args).await?;
    preflight(&ctx).await?;
    let mut results = Vec::new();
    for scenario in selected {
        println!("\n=== {} — {}", scenario.name, scenario.about);
        let start = Instant::now();
        let limit = SCENARIO_LIMIT.mul_f64(args.timeout_scale);
        let outcome = match tokio::time::timeout(limit, (scenario.run)(&ctx)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(anyhow::anyhow!(
                "the scenario did not finish within {} s",
                limit.as_secs()
            )),
        };
        let seconds = start.elapsed().as_secs_f64();
        let verdict = match outcome {
            Ok(ScenarioOutcome::Passed) => {
                println!("--- PASS {} ({seconds:.1} s)", scenario.name);
                Verdict::Pass
            }
            Ok(ScenarioOutcome::Skipped(why)) => {
                println!("--- SKIP {}: {why}", scenario.name);
                Verdict::Skip(why)
            }
            Err(error) => {
                println!("--- FAIL {} ({seconds:.1} s)\n  {error:#}", scenario.name);
                dump::dump(&ctx, &ctx.namespaces()).await;
                Verdict::Fail(format!("{error:#}"))
            }
        };
        cleanup(&ctx).await;
        let failed = matches!(verdict, Verdict::Fail(_));
        results.push((scenario.name, seconds, verdict));
        if failed && args.fail_fast {
            break;
        }
    }
    Ok(summary(&results, args.no_skip))
}

/// Deletes the namespaces the scenario left (after a failure; a passing scenario deleted its own).
async fn cleanup(ctx: &Ctx) {
    for namespace in ctx.take_namespaces() {
        if let Err(error) = ctx.delete_namespace(&namespace).await {
            println!("  cleanup: {error:#}");
        }
    }
}

fn summary(results: &[(&str, f64, Verdict)], no_skip: bool) -> bool {
    println!("\n=== summary");
    let mut ok = true;
    for (name, seconds, verdict) in results {
        let (word, detail) = match verdict {
            Verdict::Pass => ("PASS", String::new()),
            Verdict::Skip(why) => {
                ok &= !no_skip;
                (
                    if no_skip {
                        "SKIP (not allowed: --no-skip)"
                    } else {
                        "SKIP"
                    },
                    format!(": {why}"),
                )
            }
            Verdict::Fail(error) => {
                ok = false;
                let first = error.lines().next().unwrap_or_default();
                ("FAIL", format!(": {first}"))
            }
        };
        println!("{word:<5} {name:<22} {seconds:>6.1} s{detail}");
    }
    let passed = results
        .iter()
        .filter(|r| matches!(r.2, Verdict::Pass))
        .count();
    println!("{passed} of {} scenarios passed", results.len());
    ok
}
