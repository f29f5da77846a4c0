//! Controllers running in-process against the API-server fake.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_api::names::TOPOLOGY_AWARE_GATE;
use tessera_controller::{Controller, ControllerConfig, Leadership, LeaseConfig, Metrics};
use tessera_fake_apiserver::FakeApiServer;
use tessera_placement::protocol::{ClaimMark, PLACEMENT_CONDITION};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::*;

/// How long a test waits for the controller to get somewhere.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A fake API server with `managed` topology-managed DGX H100 nodes (`dgx-0`, …), `plain`
/// unmanaged ones (`plain-0`, …) and the shipped classes.
pub fn cluster(managed: usize, plain: usize) -> FakeApiServer {
    let api = FakeApiServer::new();
    for class in shipped_classes() {
        api.seed(&class);
    }
    for (prefix, count, is_managed) in [("dgx", managed, true), ("plain", plain, false)] {
        for i in 0..count {
            let name = format!("{prefix}-{i}");
            api.seed(&node(&name, is_managed));
            for slice in dgx_slices(&name, is_managed) {
                api.seed(&slice);
            }
        }
    }
    api
}

/// A controller task.
pub struct Running {
    pub metrics: Arc<Metrics>,
    pub leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    /// Graceful shutdown: finish, release the lease, stop.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.task)
            .await
            .expect("the controller stops in time")
            .expect("the controller task does not panic");
    }

    /// Kills the controller where it stands (no lease release, writes in flight dropped).
    pub fn kill(self) {
        self.task.abort();
    }
}

/// Starts a controller (no leader election) on `api`.
pub fn start(api: &FakeApiServer) -> Running {
    start_with(api, ControllerConfig::new(TOPOLOGY_AWARE_GATE))
}

/// A lease with test timing: 2 s duration, 1.5 s renew deadline, 200 ms retries.
pub fn test_lease(identity: &str) -> LeaseConfig {
    let mut lease = LeaseConfig::new("tessera-system", "tessera-controller", identity);
    lease.lease_duration = Duration::from_secs(2);
    lease.renew_deadline = Duration::from_millis(1500);
    lease.retry_period = Duration::from_millis(200);
    lease
}

/// Starts a controller with `config` on `api`.
pub fn start_with(api: &FakeApiServer, config: ControllerConfig) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let metrics = Arc::new(Metrics::new());
    let controller = Controller::new(api.client(), config, metrics.clone());
    let leadership = controller.leadership();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));
    Running {
        metrics,
        leadership,
        stop: Some(stop),
        task,
    }
}

/// Waits until the pod's gate is gone.
pub async fn released(api: &FakeApiServer, pod: &str) -> Pod {
    api.wait_for::<Pod>(Some(NS), pod, PATIENCE, |p| {
        !tessera_placement::protocol::is_gated(p, TOPOLOGY_AWARE_GATE)
    })
    .await
    .unwrap_or_else(|last| panic!("pod {pod} was not released: {last:#?}"))
}

/// Waits until the pod has the controller's condition with `reason`.
pub async fn condition(api: &FakeApiServer, pod: &str, reason: &str) -> (String, String) {
    let p = api
        .wait_for::<Pod>(Some(NS), pod, PATIENCE, |p| {
            placement_condition(p).is_some_and(|(_, r, _)| r == reason)
        })
        .await
        .unwrap_or_else(|last| {
            panic!("pod {pod} did not get condition reason {reason}: {last:#?}")
        });
    let (status, _, message) = placement_condition(&p).expect("checked");
    (status, message)
}

/// `(status, reason, message)` of the controller's condition.
pub fn placement_condition(pod: &Pod) -> Option<(String, String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == PLACEMENT_CONDITION)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// A claim as stored.
pub fn claim(api: &FakeApiServer, name: &str) -> ResourceClaim {
    api.get::<ResourceClaim>(Some(NS), name)
        .unwrap_or_else(|| panic!("claim {name} exists"))
}

/// `(node, devices)` of an allocated claim.
pub fn placement(claim: &ResourceClaim) -> Option<(String, Vec<String>)> {
    let allocation = claim.status.as_ref()?.allocation.as_ref()?;
    let devices = devices_of(allocation);
    let node = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| r.pool.clone())
        .next()?;
    Some((node, devices))
}

/// Waits until the claim is allocated and returns `(node, devices)`.
pub async fn allocated_claim(api: &FakeApiServer, name: &str) -> (String, Vec<String>) {
    let c = api
        .wait_for::<ResourceClaim>(Some(NS), name, PATIENCE, |c| placement(c).is_some())
        .await
        .unwrap_or_else(|last| panic!("claim {name} was not allocated: {last:#?}"));
    placement(&c).expect("checked")
}

/// The controller's mark on a claim.
pub fn mark(claim: &ResourceClaim) -> Option<ClaimMark> {
    ClaimMark::of(claim)
}

/// Events about a pod, as `(reason, note)`.
pub fn events(api: &FakeApiServer, pod: &str) -> Vec<(String, String)> {
    api.list::<Event>(Some(NS))
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Waits until an event with `reason` is published about the pod; returns its note.
pub async fn event(api: &FakeApiServer, pod: &str, reason: &str) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some((_, note)) = events(api, pod).into_iter().find(|(r, _)| r == reason) {
            return note;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {reason} event for pod {pod}; events: {:#?}",
            events(api, pod)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every device allocated by the claims in the cluster, with the claims holding it — for
/// "no device is allocated twice".
pub fn double_allocations(api: &FakeApiServer) -> Vec<(String, Vec<String>)> {
    let mut holders: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for c in api.list::<ResourceClaim>(None) {
        let name = c.metadata.name.clone().unwrap_or_default();
        if let Some(allocation) = c.status.as_ref().and_then(|s| s.allocation.as_ref()) {
            for r in allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                holders
                    .entry(format!("{}/{}", r.pool, r.device))
                    .or_default()
                    .push(name.clone());
            }
        }
    }
    holders.into_iter().filter(|(_, h)| h.len() > 1).collect()
}
