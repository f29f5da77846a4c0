//! The placement benchmark's pieces: the cluster's topology and fragmentation, the workload's
//! claim sizes, the controller child process (memory, `/metrics`), and the report.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSlice};
use serde::Serialize;
use tessera_api::names::attr;
use tessera_fake_apiserver::FakeApiServer;

use super::support::{Source, allocated, gated_pod, gpu_claim};

/// Where each GPU is: `(pool, device)` → `(NVLink island, NUMA node)`.
#[derive(Default)]
pub struct Topology {
    places: HashMap<(String, String), (String, String)>,
}

fn attribute_text(value: &DeviceAttribute) -> String {
    value
        .string
        .clone()
        .or_else(|| value.int.map(|i| i.to_string()))
        .or_else(|| value.version.clone())
        .or_else(|| value.bool.map(|b| b.to_string()))
        .unwrap_or_default()
}

impl Topology {
    /// Records the devices of a rendered slice. Attributes are matched by their unqualified name
    /// (`numaNode` is published as `resource.kubernetes.io/numaNode`).
    pub fn add(&mut self, slice: &ResourceSlice) {
        for device in slice.spec.devices.iter().flatten() {
            let attributes = device.attributes.clone().unwrap_or_default();
            let find = |name: &str| {
                let unqualified = name.rsplit('/').next();
                attributes
                    .iter()
                    .find(|(key, _)| key.rsplit('/').next() == unqualified)
                    .map(|(_, value)| attribute_text(value))
                    .unwrap_or_else(|| panic!("device {} has no {name} attribute", device.name))
            };
            self.places.insert(
                (slice.spec.pool.name.clone(), device.name.clone()),
                (find(attr::NVLINK_ISLAND), find(attr::NUMA_NODE)),
            );
        }
    }

    /// Number of devices.
    pub fn devices(&self) -> usize {
        self.places.len()
    }

    /// `(island, numa)` of a device, qualified by its pool (islands are per node).
    pub fn place(&self, pool: &str, device: &str) -> (String, String) {
        let (island, numa) = self
            .places
            .get(&(pool.to_owned(), device.to_owned()))
            .unwrap_or_else(|| {
                panic!("an allocated device {pool}/{device} that was not published")
            });
        (format!("{pool}/{island}"), format!("{pool}/{numa}"))
    }
}

/// Fragments node number `index`: three of every four nodes get claims allocated to running pods
/// (1 GPU; 2 GPUs across the NUMA nodes; 3 + 1 GPUs across the NUMA nodes). Returns the number of
/// claims created.
pub fn fragment(api: &FakeApiServer, node: &str, index: usize) -> usize {
    let taken: &[&[&str]] = match index % 4 {
        0 => &[],
        1 => &[&["gpu-3"]],
        2 => &[&["gpu-1", "gpu-6"]],
        _ => &[&["gpu-0", "gpu-2", "gpu-5"], &["gpu-7"]],
    };
    for (i, devices) in taken.iter().enumerate() {
        let claim = format!("{node}-running-{i}");
        let count = i64::try_from(devices.len()).expect("small");
        api.seed(&allocated(gpu_claim(&claim, count), node, devices));
        let mut pod = gated_pod(&claim, &[("gpus", Source::Claim(&claim))]);
        let spec = pod.spec.as_mut().expect("a spec");
        spec.scheduling_gates = None;
        spec.node_name = Some(node.to_owned());
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        api.seed::<Pod>(&pod);
    }
    taken.len()
}

/// Claim sizes 1, 2, 4, 8 GPUs with weights 40/25/20/15 (`tessera simulate`'s default trace), from
/// a fixed seed (xorshift).
pub struct SizeStream(u64);

impl SizeStream {
    pub fn new(seed: u64) -> SizeStream {
        SizeStream(seed.max(1))
    }

    pub fn next_size(&mut self) -> i64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        match self.0 % 100 {
            0..40 => 1,
            40..65 => 2,
            65..85 => 4,
            _ => 8,
        }
    }
}

/// The `p`th percentile of sorted latencies, in milliseconds.
pub fn percentile(sorted: &[Duration], p: usize) -> f64 {
    let index = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// A process's memory from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Resident set now.
    pub rss_mib: f64,
    /// Peak resident set since the process started.
    pub hwm_mib: f64,
}

impl Memory {
    pub fn of(pid: u32) -> Memory {
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .map(|kib| kib / 1024.0)
                .unwrap_or_else(|| panic!("{path} has no {name}"))
        };
        Memory {
            rss_mib: field("VmRSS:"),
            hwm_mib: field("VmHWM:"),
        }
    }
}

/// `GET path` over HTTP/1.0 (no chunked bodies): `(status, body)`.
fn http_get(address: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The `tessera-controller` binary running as a child process.
pub struct ControllerProcess {
    child: Child,
    metrics_address: SocketAddr,
    started: Instant,
}

impl ControllerProcess {
    /// Starts the binary against `kubeconfig` with leader election on (as deployed), logging to
    /// `log`.
    pub fn spawn(binary: &str, kubeconfig: &Path, log: &Path) -> ControllerProcess {
        // A free port for /metrics: bound, read, released.
        let metrics_address = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        let log_file =
            std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let child = Command::new(binary)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--metrics-address")
            .arg(metrics_address.to_string())
            .args(["--leader-elect=true", "--lease-namespace", "tessera-system"])
            .args(["--identity", "placement-bench"])
            .env("RUST_LOG", crate::timeline::LOG_FILTER)
            .env("TESSERA_LOG_FORMAT", "json")
            .env_remove("TESSERA_LOG_LEVEL")
            .stdout(log_file.try_clone().expect("a second log handle"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {binary}: {e}"));
        println!(
            "started {binary} (pid {}), log {}",
            child.id(),
            log.display()
        );
        ControllerProcess {
            child,
            metrics_address,
            started: Instant::now(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let address = self.metrics_address;
        let (status, body) = tokio::task::spawn_blocking(move || http_get(address, "/metrics"))
            .await
            .expect("the metrics request runs")
            .expect("GET /metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        body
    }

    /// Waits until `/readyz` answers 200 (every watch listed) and the replica leads; returns the
    /// seconds since the start.
    pub async fn wait_leading(&self, patience: Duration) -> f64 {
        let address = self.metrics_address;
        let deadline = Instant::now() + patience;
        loop {
            let probe = tokio::task::spawn_blocking(move || {
                let ready = http_get(address, "/readyz").ok()?.0 == 200;
                let metrics = http_get(address, "/metrics").ok()?.1;
                Some(ready && metrics.lines().any(|l| l == "tessera_controller_leader 1"))
            })
            .await
            .expect("the probe runs");
            if probe == Some(true) {
                return self.started.elapsed().as_secs_f64();
            }
            assert!(
                Instant::now() < deadline,
                "the controller was not ready and leading within {patience:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM (graceful shutdown), then waits for the exit.
    pub async fn stop(mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        if !sent.is_ok_and(|s| s.success()) {
            let _ = self.child.kill();
        }
        let status = tokio::task::spawn_blocking(move || self.child.wait())
            .await
            .expect("the wait runs")
            .expect("wait for the controller");
        assert!(status.success(), "the controller exited with {status}");
    }
}

/// What the controller's `/metrics` said after the workload.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSummary {
    pub claims_allocated: u64,
    pub pods_placed: u64,
    pub claims_undone: u64,
    pub inventory_rebuilds: u64,
    pub failures: BTreeMap<String, u64>,
    /// Pods decided (queue pop to decision), the mean, and the bucket bounds holding p50 and p99.
    pub decisions: u64,
    pub decision_mean_millis: f64,
    pub decision_p50_bucket_millis: f64,
    pub decision_p99_bucket_millis: f64,
    /// Queue pop to gate removed, for placed pods.
    pub placement_mean_millis: f64,
    pub placement_p99_bucket_millis: f64,
}

/// The `le` bound (ms) of the first bucket holding `q` of the observations.
fn bucket_quantile(buckets: &[(f64, f64)], count: f64, q: f64) -> f64 {
    buckets
        .iter()
        .find(|(_, cumulative)| *cumulative >= q * count)
        .map_or(f64::INFINITY, |(le, _)| le * 1e3)
}

fn histogram(text: &str, name: &str) -> (f64, f64, Vec<(f64, f64)>) {
    let value = |line: &str| line.rsplit(' ').next()?.parse::<f64>().ok();
    let mut buckets = Vec::new();
    let (mut sum, mut count) = (0.0, 0.0);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{le=\"")) {
            let le = rest.split('"').next().and_then(|l| l.parse::<f64>().ok());
            if let (Some(le), Some(v)) = (le, value(line)) {
                buckets.push((le, v));
            }
        } else if line.starts_with(&format!("{name}_sum ")) {
            sum = value(line).unwrap_or(0.0);
        } else if line.starts_with(&format!("{name}_count ")) {
            count = value(line).unwrap_or(0.0);
        }
    }
    (sum, count, buckets)
}

impl MetricsSummary {
    pub fn parse(text: &str) -> MetricsSummary {
        let counter = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("tessera_controller_{name}_total ")))
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        };
        let failures = text
            .lines()
            .filter_map(|l| l.strip_prefix("tessera_controller_failures_total{reason=\""))
            .filter_map(|rest| {
                let (reason, value) = rest.split_once("\"} ")?;
                Some((reason.to_owned(), value.parse::<f64>().ok()? as u64))
            })
            .collect();
        let (sum, count, buckets) = histogram(text, "tessera_controller_decision_duration_seconds");
        let (p_sum, p_count, p_buckets) =
            histogram(text, "tessera_controller_placement_duration_seconds");
        MetricsSummary {
            claims_allocated: counter("claims_allocated"),
            pods_placed: counter("pods_placed"),
            claims_undone: counter("claims_undone"),
            inventory_rebuilds: counter("inventory_rebuilds"),
            failures,
            decisions: count as u64,
            decision_mean_millis: sum / count.max(1.0) * 1e3,
            decision_p50_bucket_millis: bucket_quantile(&buckets, count, 0.5),
            decision_p99_bucket_millis: bucket_quantile(&buckets, count, 0.99),
            placement_mean_millis: p_sum / p_count.max(1.0) * 1e3,
            placement_p99_bucket_millis: bucket_quantile(&p_buckets, p_count, 0.99),
        }
    }
}

/// One phase of the workload.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phase {
    pub phase: &'static str,
    pub claims: usize,
    pub claims_by_gpus: BTreeMap<i64, usize>,
    /// From the first claim created to the last allocation seen.
    pub seconds: f64,
    pub claims_per_second: f64,
    /// Claim created → allocation seen on the benchmark's watch.
    pub p50_millis: f64,
    pub p99_millis: f64,
    pub max_millis: f64,
    /// The five slowest claims: name, GPUs, milliseconds.
    pub slowest: Vec<(String, i64, f64)>,
}

/// Everything the benchmark measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub nodes: usize,
    pub gpus: usize,
    pub preallocated_claims: usize,
    pub paced_interval_millis: f64,
    /// Process start → ready (every watch listed, the inventory built) and the Lease held.
    pub sync_seconds: f64,
    pub memory_after_sync: Memory,
    pub memory_after_paced: Memory,
    pub memory_after_workload: Memory,
    pub phases: Vec<Phase>,
    pub metrics: MetricsSummary,
    pub four_gpu_claims: usize,
    pub four_gpu_claims_numa_local: usize,
    /// Every benchmark claim's timeline.
    pub claims: Vec<crate::timeline::ClaimTimeline>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "Cluster: {} dgx-h100 nodes ({} GPUs), {} claims pre-allocated; paced stream one pod every {:.0} ms.\n\n",
            self.nodes, self.gpus, self.preallocated_claims, self.paced_interval_millis
        );
        md.push_str("| phase | claims (1/2/4/8 GPUs) | claims/s | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|---:|\n");
        for p in &self.phases {
            let sizes: Vec<String> = [1, 2, 4, 8]
                .iter()
                .map(|g| p.claims_by_gpus.get(g).copied().unwrap_or(0).to_string())
                .collect();
            md.push_str(&format!(
                "| {} | {} ({}) | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                p.phase,
                p.claims,
                sizes.join("/"),
                p.claims_per_second,
                p.p50_millis,
                p.p99_millis,
                p.max_millis
            ));
        }
        let m = &self.metrics;
        md.push_str(&format!(
            "\nController memory (VmRSS / VmHWM): after sync {:.1} / {:.1} MiB, after the paced stream {:.1} / {:.1} MiB, after the burst {:.1} / {:.1} MiB. Ready (start → every watch listed, the inventory built, the Lease held): {:.1} s.\n",
            self.memory_after_sync.rss_mib,
            self.memory_after_sync.hwm_mib,
            self.memory_after_paced.rss_mib,
            self.memory_after_paced.hwm_mib,
            self.memory_after_workload.rss_mib,
            self.memory_after_workload.hwm_mib,
            self.sync_seconds
        ));
        md.push_str(&format!(
            "\nController `/metrics`: {} decisions, mean {:.2} ms, p50 ≤ {} ms, p99 ≤ {} ms (histogram buckets); queue pop → gate removed mean {:.2} ms, p99 ≤ {} ms; {} claims allocated, {} undone, {} inventory rebuilds, failures {:?}.\n",
            m.decisions,
            m.decision_mean_millis,
            m.decision_p50_bucket_millis,
            m.decision_p99_bucket_millis,
            m.placement_mean_millis,
            m.placement_p99_bucket_millis,
            m.claims_allocated,
            m.claims_undone,
            m.inventory_rebuilds,
            m.failures
        ));
        md.push_str(&format!(
            "\nChecked: every claim on one node and one NVLink island, no device allocated twice, every pod released. 4-GPU claims on one NUMA node: {} of {}.\n",
            self.four_gpu_claims_numa_local, self.four_gpu_claims
        ));
        for phase in &self.phases {
            md.push_str(&format!(
                "\nThe {} phase's slowest claims (steps in ms after the claim was created):\n\n",
                phase.phase
            ));
            for (name, _, _) in &phase.slowest {
                if let Some(t) = self.claims.iter().find(|t| &t.claim == name) {
                    md.push_str(&format!("- {}\n", t.describe()));
                }
            }
        }
        md
    }
}
