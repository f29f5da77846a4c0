//! The GPU monitor: every `--gpu-metrics-interval` it samples the GPUs (NVML on a blocking
//! thread), reads from the checkpoint which claim holds which device
//! ([`tessera_prepare::NodeDriver::holders`]), learns each claim's pods from its `status.reservedFor`
//! (one claim read when the claim is new, again every [`POD_REFRESH`]), exports the labelled
//! series ([`super::GpuMetrics`]) and, with idle detection on, records a `GPUIdle` Event on the
//! pods of a claim that just became idle ([`super::idle`]).
//!
//! RBAC: `get` on `resourceclaims` (as prepare) and `create`/`patch` on `events.k8s.io` events
//! (as every Event the plugin records); nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tessera_gpu_inventory::DeviceName;
use tessera_kubelet_grpc::ClaimUid;
use tessera_nvml::GpuTelemetry;
use tessera_prepare::claims::ClaimSource;
use tessera_prepare::driver::HeldDevice;
use tessera_prepare::inventory::NodeInventory;
use tessera_process::{Heartbeat, Stop};
use tokio::task::JoinHandle;

use super::idle::{ClaimUtilization, IdleSettings, IdleTracker};
use super::{ClaimLabels, GpuMetrics, PodRef, TelemetrySource, series};
use crate::claims::truncate;
use crate::metrics::ResultLabel;

/// Reason of the Event on the pods of an idle claim.
pub const GPU_IDLE_REASON: &str = "GPUIdle";
/// How often a claim's pods are read again (a shared claim gains and loses pods).
pub const POD_REFRESH: Duration = Duration::from_secs(60);
/// Default sampling interval (`--gpu-metrics-interval`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// How the monitor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMonitorSettings {
    /// Time between samples.
    pub interval: Duration,
    /// Idle-claim detection; `None` turns it off.
    pub idle: Option<IdleSettings>,
}

impl Default for GpuMonitorSettings {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            idle: Some(IdleSettings::default()),
        }
    }
}

impl GpuMonitorSettings {
    /// How long the monitor may go without a beat before `/healthz` calls it stuck.
    pub fn max_silence(&self) -> Duration {
        (self.interval * 3).max(Duration::from_secs(60))
    }
}

/// Where the Events on pods go.
pub trait PodEvents: Send + Sync + 'static {
    /// Records a Warning Event with reason [`GPU_IDLE_REASON`] on `pod`.
    fn gpu_idle(&self, pod: PodRef, note: String) -> BoxFuture<'_, Result<(), String>>;
}

/// Events through the API server (`events.k8s.io/v1`).
#[derive(Clone)]
pub struct KubePodEvents {
    recorder: Recorder,
}

impl KubePodEvents {
    /// Records as `tessera-kubelet-plugin`, instance `node_name`.
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "tessera-kubelet-plugin".into(),
                    instance: Some(node_name.to_owned()),
                },
            ),
        }
    }
}

impl PodEvents for KubePodEvents {
    fn gpu_idle(&self, pod: PodRef, note: String) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
                ..ObjectReference::default()
            };
            let event = Event {
                type_: EventType::Warning,
                reason: GPU_IDLE_REASON.into(),
                note: Some(truncate(&note, 1024)),
                action: "MonitorGPUs".into(),
                secondary: None,
            };
            self.recorder
                .publish(&event, &reference)
                .await
                .map_err(|e| {
                    format!(
                        "cannot record an Event on pod {}/{}: {e}",
                        pod.namespace, pod.name
                    )
                })
        })
    }
}

/// Events kept in memory (tests).
#[derive(Debug, Default)]
pub struct RecordedPodEvents {
    events: Mutex<Vec<(PodRef, String)>>,
}

impl RecordedPodEvents {
    /// The Events so far: pod and note.
    pub fn events(&self) -> Vec<(PodRef, String)> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl PodEvents for RecordedPodEvents {
    fn gpu_idle(&self, pod: PodRef, note: String) -> BoxFuture<'_, Result<(), String>> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pod, note));
        Box::pin(async { Ok(()) })
    }
}

/// XID errors per GPU UUID, counted by the health monitor. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct XidCounts(Arc<Mutex<HashMap<String, u64>>>);

impl XidCounts {
    /// Counts one XID on the GPU `uuid`.
    pub fn add(&self, uuid: &str) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uuid.to_owned())
            .or_default() += 1;
    }

    /// XIDs counted on the GPU `uuid`.
    pub fn get(&self, uuid: &str) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uuid)
            .copied()
            .unwrap_or(0)
    }
}

/// The devices of the prepared claims now.
pub type Holders = Arc<dyn Fn() -> Vec<HeldDevice> + Send + Sync>;

/// The monitor's parts.
pub struct GpuMonitor {
    pub source: Arc<dyn TelemetrySource>,
    pub holders: Holders,
    pub inventory: Arc<NodeInventory>,
    pub claims: Arc<dyn ClaimSource>,
    pub events: Arc<dyn PodEvents>,
    pub metrics: GpuMetrics,
    pub xids: XidCounts,
    pub settings: GpuMonitorSettings,
    pub heartbeat: Heartbeat,
}

/// What the monitor keeps between samples.
#[derive(Debug)]
pub struct MonitorState {
    /// Pods by claim UID, with when they were read.
    pods: HashMap<ClaimUid, Vec<PodRef>>,
    read_at: HashMap<ClaimUid, Instant>,
    tracker: Option<IdleTracker>,
}

impl MonitorState {
    pub fn new(settings: &GpuMonitorSettings) -> Self {
        Self {
            pods: HashMap::new(),
            read_at: HashMap::new(),
            tracker: settings.idle.map(IdleTracker::new),
        }
    }
}

impl GpuMonitor {
    /// Samples every interval until `stop` is cancelled.
    pub fn spawn(self, stop: Stop) -> JoinHandle<()> {
        tokio::spawn(async move {
            tracing::info!(interval = ?self.settings.interval, idle = ?self.settings.idle, "GPU monitor started");
            let mut state = MonitorState::new(&self.settings);
            let mut ticks = tokio::time::interval(self.settings.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                self.heartbeat.beat();
                self.sample_once(&mut state).await;
            }
            tracing::info!("GPU monitor stopped");
        })
    }

    /// One sample: read, label, export, detect idle claims.
    pub async fn sample_once(&self, state: &mut MonitorState) {
        let source = Arc::clone(&self.source);
        let gpus = match tokio::task::spawn_blocking(move || source.sample()).await {
            Ok(Ok(gpus)) => gpus,
            Ok(Err(error)) => {
                self.metrics.sampled(ResultLabel::Error);
                tracing::warn!(%error, "cannot sample the GPUs; retrying at the next interval");
                return;
            }
            Err(error) => {
                self.metrics.sampled(ResultLabel::Error);
                tracing::error!(%error, "sampling the GPUs panicked");
                return;
            }
        };
        self.metrics.sampled(ResultLabel::Success);
        for gpu in &gpus {
            for (query, error) in &gpu.failures {
                tracing::debug!(gpu = %gpu.uuid, query = %query, %error, "GPU query failed; its value is left out");
            }
        }
        let holders = (self.holders)();
        self.read_pods(&holders, state).await;
        let inventory = self.inventory.current();
        let name = |uuid: &str| {
            let gpu = inventory.gpus.iter().find(|g| g.uuid == uuid)?;
            Some(DeviceName::Gpu { minor: gpu.minor }.to_string())
        };
        let labelled = series(&gpus, &holders, &state.pods, name);
        self.metrics.update(&labelled, |uuid| self.xids.get(uuid));
        if let Some(tracker) = &mut state.tracker {
            let idle = detect_idle(tracker, &gpus, &holders);
            self.metrics.set_idle(tracker.idle());
            for (claim_uid, note) in idle {
                tracing::warn!(claim_uid = %claim_uid, "{note}");
                for pod in state.pods.get(&claim_uid).into_iter().flatten() {
                    if let Err(error) = self.events.gpu_idle(pod.clone(), note.clone()).await {
                        tracing::warn!(%error, "cannot report an idle claim");
                    }
                }
            }
        }
    }

    /// Reads the pods of claims that are new or were read [`POD_REFRESH`] ago; forgets the
    /// claims that went.
    async fn read_pods(&self, holders: &[HeldDevice], state: &mut MonitorState) {
        let live: BTreeSet<&ClaimUid> = holders.iter().map(|h| &h.claim_uid).collect();
        state.pods.retain(|uid, _| live.contains(uid));
        state.read_at.retain(|uid, _| live.contains(uid));
        let mut done = BTreeSet::new();
        for holder in holders {
            let fresh = state
                .read_at
                .get(&holder.claim_uid)
                .is_some_and(|at| at.elapsed() < POD_REFRESH);
            if fresh || !done.insert(&holder.claim_uid) {
                continue;
            }
            let read = self
                .claims
                .get(holder.namespace.clone(), holder.claim.clone())
                .await;
            match read {
                Ok(claim) => {
                    let pods = claim
                        .filter(|c| c.metadata.uid.as_deref() == Some(holder.claim_uid.as_str()))
                        .map(|c| reserved_pods(&c))
                        .unwrap_or_default();
                    state.pods.insert(holder.claim_uid.clone(), pods);
                    state
                        .read_at
                        .insert(holder.claim_uid.clone(), Instant::now());
                }
                Err(error) => {
                    tracing::debug!(%error, "cannot read a claim's pods for the GPU metrics; retrying at the next sample");
                }
            }
        }
    }
}

/// The pods a claim is reserved for (`status.reservedFor` entries of core `pods`).
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<PodRef> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| PodRef {
            namespace: namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
        .collect()
}

/// Feeds one sample to the tracker; returns the claims that became idle (UID and the note of
/// their Event).
fn detect_idle(
    tracker: &mut IdleTracker,
    gpus: &[GpuTelemetry],
    holders: &[HeldDevice],
) -> Vec<(ClaimUid, String)> {
    let utilization: HashMap<&str, Option<u32>> = gpus
        .iter()
        .map(|g| (g.uuid.as_str(), g.utilization_percent))
        .collect();
    let mut claims: BTreeMap<ClaimUid, ClaimUtilization> = BTreeMap::new();
    for holder in holders {
        let value = utilization.get(holder.gpu_uuid.as_str()).copied().flatten();
        let entry = claims
            .entry(holder.claim_uid.clone())
            .or_insert_with(|| ClaimUtilization {
                claim: ClaimLabels {
                    namespace: holder.namespace.clone(),
                    claim: holder.claim.clone(),
                },
                highest_percent: Some(0),
            });
        entry.highest_percent = match (entry.highest_percent, value) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let settings = tracker.settings();
    tracker
        .observe(Instant::now(), claims)
        .into_iter()
        .map(|idle| {
            let devices: Vec<&str> = holders
                .iter()
                .filter(|h| h.claim_uid == idle.claim_uid)
                .map(|h| h.device.as_str())
                .collect();
            let note = format!(
                "claim {}/{} holds {} whose utilization stayed below {}% for {}: the GPUs sit \
                 idle; release the claim if the workload does not need them",
                idle.claim.namespace,
                idle.claim.claim,
                devices.join(", "),
                settings.threshold_percent,
                display_duration(idle.idle_for)
            );
            (idle.claim_uid, note)
        })
        .collect()
}

/// `90s`, `5m`, `1h30m`.
fn display_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let mut text = String::new();
    if h > 0 {
        text.push_str(&format!("{h}h"));
    }
    if m > 0 {
        text.push_str(&format!("{m}m"));
    }
    if s > 0 || text.is_empty() {
        text.push_str(&format!("{s}s"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_flags() {
        assert_eq!(display_duration(Duration::from_secs(0)), "0s");
        assert_eq!(display_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(display_duration(Duration::from_secs(1800)), "30m");
        assert_eq!(display_duration(Duration::from_secs(5400)), "1h30m");
    }
}
