//! `tessera-controller`: flags, logging, signals, wiring. Everything else is in the library.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{ArgAction, Parser};
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_controller::{Controller, ControllerConfig, LeaseConfig, Metrics, WebhookConfig};
use tessera_placement::group::{DEFAULT_GROUP_BUDGET, Hierarchy};
use tessera_process::{
    COMMON_RENAMED, ClientArgs, EndpointServer, LogArgs, Renamed, Stop, parse_duration,
};

/// The downward API's `POD_NAME` (accepted without a warning: Kubernetes' convention), and the
/// names every binary accepts (`KUBECONFIG`, `LOG_FORMAT`).
fn renamed() -> Vec<Renamed> {
    [Renamed::convention("POD_NAME", "TESSERA_IDENTITY")]
        .iter()
        .chain(&COMMON_RENAMED)
        .copied()
        .collect()
}

/// The default `--topology-levels`: rack, block, zone.
const DEFAULT_TOPOLOGY_LEVELS: &str =
    "gpu.tessera.dev/rack,gpu.tessera.dev/block,topology.kubernetes.io/zone";

/// Allocates the ResourceClaims of gated pods on the best-connected topology-managed GPUs.
#[derive(Debug, Parser)]
#[command(
    name = "tessera-controller",
    version,
    long_version = tessera_process::build::LONG_VERSION,
    max_term_width = 100,
    after_help = "Every flag can also be set by its environment variable (shown with each flag); \
                  POD_NAME, POD_NAMESPACE and KUBECONFIG are read as Kubernetes' conventions."
)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,

    /// Elect a leader among replicas on a Lease; only the leader writes.
    #[arg(long, env = "TESSERA_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    leader_elect: bool,

    /// Namespace of the Lease [default: $TESSERA_NAMESPACE, else $POD_NAMESPACE, else
    /// tessera-system].
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

    /// Node labels of the topology domains groups are kept within, finest first, separated by
    /// commas (docs/protocol.md, "Groups"); empty: fabric cliques only.
    #[arg(long, env = "TESSERA_TOPOLOGY_LEVELS", default_value = DEFAULT_TOPOLOGY_LEVELS)]
    topology_levels: String,

    /// Pod decisions one group (gang) decision may take before it keeps the best group found.
    #[arg(long, env = "TESSERA_GROUP_BUDGET", default_value_t = DEFAULT_GROUP_BUDGET)]
    group_budget: usize,

    /// How long a group waits for capacity before pods and groups that arrived after it wait
    /// behind it.
    #[arg(long, env = "TESSERA_GROUP_HOLD", default_value = "60s", value_parser = parse_duration)]
    group_hold: Duration,

    /// NUMA alignment against fragmentation: `align` (a claim that fits one NUMA node gets one
    /// wherever a node allows it) or `pack` (partly used nodes fill first). A pod's annotation
    /// gpu.tessera.dev/numa-policy overrides it.
    #[arg(long, env = "TESSERA_NUMA_POLICY", default_value = "align")]
    numa_policy: tessera_allocator::NumaPolicy,

    /// Whether a pod that fits on no free devices preempts running pods of lower priority that
    /// hold GPUs. Off, pods still go by priority, and nobody is evicted.
    #[arg(long, env = "TESSERA_PREEMPTION", default_value_t = true, action = ArgAction::Set)]
    preemption: bool,
    /// IMEX channels published per fabric clique (docs/user-guide.md, "Jobs across NVLink racks
    /// (IMEX)"); 0 publishes none and deletes those published.
    #[arg(long, env = "TESSERA_IMEX_CHANNELS", default_value_t = tessera_api::imex::DEFAULT_CHANNELS,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(tessera_api::imex::MAX_CHANNELS)))]
    imex_channels: u32,

    #[command(flatten)]
    webhook: WebhookArgs,

    #[command(flatten)]
    log: LogArgs,

    /// This replica's name, for the Lease and events [default: $POD_NAME, else the host name].
    #[arg(long, env = "TESSERA_IDENTITY")]
    identity: Option<String>,
}

/// The admission webhook (docs/admission.md): served by every replica when an address is given.
#[derive(Debug, clap::Args)]
struct WebhookArgs {
    /// Serve the admission webhooks (the device-plugin conversion, the check of claims'
    /// configurations) over HTTPS on this address, e.g. 0.0.0.0:9443; unset: no webhook.
    #[arg(long, env = "TESSERA_WEBHOOK_ADDRESS")]
    webhook_address: Option<SocketAddr>,

    /// The Service the API server calls the webhook through (its names are the serving
    /// certificate's), in the controller's namespace.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_SERVICE",
        default_value = "tessera-webhook"
    )]
    webhook_service: String,

    /// The Secret the replicas keep the webhook's CA and serving certificate in.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_SECRET",
        default_value = "tessera-webhook-certificates"
    )]
    webhook_secret: String,

    /// The namespace of the Service and the Secret (the controller's own); default: the
    /// controller's namespace ($TESSERA_NAMESPACE, else $POD_NAMESPACE, else --lease-namespace,
    /// else tessera-system).
    #[arg(long, env = "TESSERA_WEBHOOK_NAMESPACE")]
    webhook_namespace: Option<String>,

    /// The MutatingWebhookConfiguration (the device-plugin conversion) whose caBundle the
    /// controller writes; empty: none.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_CONFIGURATION",
        default_value = "tessera-device-plugin-conversion"
    )]
    webhook_configuration: String,

    /// The ValidatingWebhookConfiguration (the check of claims' opaque configurations) whose
    /// caBundle the controller writes; empty: none.
    #[arg(
        long,
        env = "TESSERA_WEBHOOK_VALIDATING_CONFIGURATION",
        default_value = ""
    )]
    webhook_validating_configuration: String,
}

impl WebhookArgs {
    /// The webhook's configuration, when it is on; `namespace`: the controller's, unless
    /// --webhook-namespace names another.
    fn config(&self, namespace: &str) -> Option<WebhookConfig> {
        self.webhook_address.map(|address| WebhookConfig {
            address,
            namespace: self
                .webhook_namespace
                .clone()
                .unwrap_or_else(|| namespace.to_owned()),
            service: self.webhook_service.clone(),
            secret: self.webhook_secret.clone(),
            configuration: self.webhook_configuration.clone(),
            validating_configuration: self.webhook_validating_configuration.clone(),
        })
    }
}

/// The controller's namespace: `--lease-namespace`, else $TESSERA_NAMESPACE, else
/// $POD_NAMESPACE, else `tessera-system`.
fn namespace(args: &Args) -> String {
    args.lease_namespace
        .clone()
        .or_else(|| std::env::var("TESSERA_NAMESPACE").ok())
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "tessera-system".to_owned())
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (args, notices) = tessera_process::env::parse::<Args>(&renamed());
    args.log.init();
    for notice in &notices {
        notice.log();
    }
    if args.renew_deadline >= args.lease_duration {
        anyhow::bail!(
            "--renew-deadline ({:?}) must be shorter than --lease-duration ({:?}), or two leaders could overlap",
            args.renew_deadline,
            args.lease_duration
        );
    }
    let client = tessera_process::kube_client(args.client.kubeconfig.as_deref()).await?;
    let identity = identity(&args);
    let mut config = ControllerConfig::new(&args.gate_name);
    config.avoid_for = args.avoid_node_for;
    config.numa = args.numa_policy;
    config.instance = Some(identity.clone());
    config.topology_levels =
        Hierarchy::parse(&args.topology_levels).context("--topology-levels")?;
    config.group_budget = args.group_budget;
    config.group_hold = args.group_hold;
    config.preemption = args.preemption;
    let namespace = namespace(&args);
    // The Service and Secret live where the controller runs, which the lease need not.
    let own_namespace = std::env::var("TESSERA_NAMESPACE")
        .or_else(|_| std::env::var("POD_NAMESPACE"))
        .unwrap_or_else(|_| namespace.clone());
    config.webhook = args.webhook.config(&own_namespace);
    config.imex_channels = args.imex_channels;
    if args.leader_elect {
        let mut lease = LeaseConfig::new(&namespace, &args.lease_name, &identity);
        lease.lease_duration = args.lease_duration;
        lease.renew_deadline = args.renew_deadline;
        lease.retry_period = args.retry_period;
        config.lease = Some(lease);
    }
    let metrics = Arc::new(Metrics::new());
    let controller = Controller::new(client, config, metrics.clone());
    let endpoints = EndpointServer::bind(args.metrics_address, controller.endpoints()).await?;
    tracing::info!(address = %args.metrics_address, gate = %args.gate_name, identity = %identity,
        leader_elect = args.leader_elect, preemption = args.preemption,
        "tessera-controller starting");
    let stop = Stop::new();
    let http = tokio::spawn(endpoints.serve(stop.clone().cancelled_owned()));
    controller.run(tessera_process::termination()).await;
    stop.cancel();
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
    fn duration_flags_refuse_zero_and_overflow_with_an_error() {
        let args = Args::try_parse_from(["tessera-controller", "--avoid-node-for", "90s"]).unwrap();
        assert_eq!(args.avoid_node_for, Duration::from_secs(90));
        assert_eq!(args.numa_policy, tessera_allocator::NumaPolicy::Align);
        assert!(args.preemption, "preemption is on by default");
        let args = Args::try_parse_from(["tessera-controller", "--preemption=false"]).unwrap();
        assert!(!args.preemption);
        let args = Args::try_parse_from(["tessera-controller", "--numa-policy", "pack"]).unwrap();
        assert_eq!(args.numa_policy, tessera_allocator::NumaPolicy::Pack);
        let error = Args::try_parse_from(["tessera-controller", "--numa-policy", "packed"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("`packed`"), "{error}");
        for (flag, value) in [
            ("--avoid-node-for", "999999999999999999m"),
            ("--avoid-node-for", "0s"),
            ("--lease-duration", "0"),
            ("--retry-period", "-2s"),
            ("--renew-deadline", "ten"),
        ] {
            let argument = format!("{flag}={value}");
            let error = Args::try_parse_from(["tessera-controller", &argument]).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(flag) && text.contains(value), "{text}");
        }
    }

    #[test]
    fn every_variable_is_prefixed_and_pod_name_still_names_the_replica() {
        use clap::CommandFactory;
        tessera_process::env::check_table(&Args::command(), &renamed()).unwrap();
        let (argv, notices) = tessera_process::env::apply_renamed(
            &Args::command(),
            &renamed(),
            |name| match name {
                "POD_NAME" => Some("controller-0".into()),
                "LOG_FORMAT" => Some("json".into()),
                _ => None,
            },
            vec!["tessera-controller".into()],
        );
        let args = Args::try_parse_from(argv).unwrap();
        assert_eq!(args.identity.as_deref(), Some("controller-0"));
        assert_eq!(args.log.log_format, tessera_process::LogFormat::Json);
        assert_eq!(
            notices,
            vec![tessera_process::OldEnvName::Deprecated {
                old: "LOG_FORMAT",
                new: "TESSERA_LOG_FORMAT"
            }]
        );
    }

    #[test]
    fn flags_have_the_documented_defaults() {
        let args = Args::try_parse_from(["tessera-controller"]).unwrap();
        assert!(args.leader_elect);
        assert_eq!(args.gate_name, TOPOLOGY_AWARE_GATE);
        assert_eq!(args.lease_name, "tessera-controller");
        assert_eq!(
            Hierarchy::parse(&args.topology_levels).unwrap(),
            Hierarchy::default(),
            "the flag's default is the library's"
        );
        assert_eq!(args.group_hold, Duration::from_secs(60));
        assert_eq!(
            args.webhook.config("tessera-system"),
            None,
            "no webhook unless asked"
        );
        assert_eq!(args.imex_channels, 128);
        assert!(Args::try_parse_from(["tessera-controller", "--imex-channels=2049"]).is_err());
        let args = Args::try_parse_from(["tessera-controller", "--leader-elect=false"]).unwrap();
        assert!(!args.leader_elect);
        let args =
            Args::try_parse_from(["tessera-controller", "--webhook-address", "0.0.0.0:9443"])
                .unwrap();
        assert_eq!(
            args.webhook.config("ml-system"),
            Some(WebhookConfig {
                address: "0.0.0.0:9443".parse().unwrap(),
                namespace: "ml-system".into(),
                service: "tessera-webhook".into(),
                secret: "tessera-webhook-certificates".into(),
                configuration: "tessera-device-plugin-conversion".into(),
                validating_configuration: String::new(),
            })
        );
        let args = Args::try_parse_from([
            "tessera-controller",
            "--webhook-address",
            "0.0.0.0:9443",
            "--webhook-namespace",
            "gpu-system",
        ])
        .unwrap();
        assert_eq!(
            args.webhook.config("ml-system").map(|c| c.namespace),
            Some("gpu-system".to_owned()),
            "the webhook's namespace is its own flag's, not the lease's"
        );
    }
}
