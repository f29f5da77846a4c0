//! `tessera-controller`: flags, logging, signals, wiring. Everything else is in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{ArgAction, Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_controller::{Controller, ControllerConfig, LeaseConfig, Metrics};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Allocates the ResourceClaims of gated pods on the best-connected topology-managed GPUs.
#[derive(Debug, Parser)]
#[command(name = "tessera-controller", version)]
struct Args {
    /// Kubeconfig to use; without it, the in-cluster service account.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Elect a leader among replicas on a Lease; only the leader writes.
    #[arg(long, env = "TESSERA_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    leader_elect: bool,

    /// Namespace of the Lease [default: $POD_NAMESPACE, else tessera-system].
    #[arg(long, env = "TESSERA_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(long, env = "TESSERA_LEASE_NAME", default_value = "tessera-controller")]
    lease_name: String,

    /// How long a leader's lease is valid without renewal.
    #[arg(long, env = "TESSERA_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// How long a leader keeps writing without a successful renewal (less than the lease duration).
    #[arg(long, env = "TESSERA_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,

    /// How often to try to acquire or renew the lease.
    #[arg(long, env = "TESSERA_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "TESSERA_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,

    /// The scheduling gate of the pods to place.
    #[arg(long, env = "TESSERA_GATE_NAME", default_value = TOPOLOGY_AWARE_GATE)]
    gate_name: String,

    /// How long to avoid a node where the scheduler gave back an allocation.
    #[arg(long, env = "TESSERA_AVOID_NODE_FOR", default_value = "5m", value_parser = parse_duration)]
    avoid_node_for: Duration,

    /// Log format (the level comes from RUST_LOG, default info).
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,

    /// This replica's name, for the Lease and events [default: $POD_NAME, else the host name].
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

/// `90s`, `5m`, `1h`, `250ms`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; write e.g. 250ms, 10s, 5m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!(
            "{text:?}: unknown unit {unit:?}; use ms, s, m or h"
        )),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("use kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster().context(
            "no --kubeconfig and not running in a pod (in-cluster configuration unavailable); pass --kubeconfig",
        )?,
    };
    kube::Client::try_from(config).context("build the Kubernetes client")
}

fn identity(args: &Args) -> String {
    let host = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tessera-controller".to_owned());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{}_{nanos:08x}", std::process::id())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(args.log_format);
    if args.renew_deadline >= args.lease_duration {
        anyhow::bail!(
            "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}), or two leaders could overlap",
            args.renew_deadline,
            args.lease_duration
        );
    }
    let client = client(args.kubeconfig.as_ref()).await?;
    let identity = identity(&args);
    let mut config = ControllerConfig::new(&args.gate_name);
    config.avoid_for = args.avoid_node_for;
    config.instance = Some(identity.clone());
    if args.leader_elect {
        let namespace = args
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "tessera-system".to_owned());
        let mut lease = LeaseConfig::new(&namespace, &args.lease_name, &identity);
        lease.lease_duration = args.lease_duration;
        lease.renew_deadline = args.renew_deadline;
        lease.retry_period = args.retry_period;
        config.lease = Some(lease);
    }
    let metrics = Arc::new(Metrics::new());
    let controller = Controller::new(client, config, metrics.clone());
    let listener = tokio::net::TcpListener::bind(args.metrics_address)
        .await
        .with_context(|| format!("listen on --metrics-address {}", args.metrics_address))?;
    tracing::info!(address = %args.metrics_address, gate = %args.gate_name, identity = %identity,
        leader_elect = args.leader_elect, "tessera-controller starting");
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = tokio::spawn(tessera_controller::http::serve(
        listener,
        metrics,
        controller.health(),
        async {
            let _ = http_stopped.await;
        },
    ));
    controller.run(shutdown_signal()).await;
    let _ = stop_http.send(());
    http.await
        .context("the metrics server task failed")?
        .context("serve /metrics")?;
    tracing::info!("tessera-controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn flags_have_the_documented_defaults() {
        let args = Args::try_parse_from(["tessera-controller"]).unwrap();
        assert!(args.leader_elect);
        assert_eq!(args.gate_name, TOPOLOGY_AWARE_GATE);
        assert_eq!(args.lease_name, "tessera-controller");
        let args = Args::try_parse_from(["tessera-controller", "--leader-elect=false"]).unwrap();
        assert!(!args.leader_elect);
    }
}
