//! A recording fake driver and a served-plugin fixture shared by the integration tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DeviceHealth, DraDriver, KubeletPlugin, PluginConfig, PrepareResult,
    PreparedDevice, ServeError, UnprepareResult,
};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;

pub const DRIVER: &str = "gpu.tessera.dev";

/// One call the fake driver received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Prepare(Vec<ClaimRef>),
    Unprepare(Vec<ClaimRef>),
}

/// A driver that records its calls and answers by claim name:
/// `fail-*` fails, `forget-*` gets no entry, `panic` panics, anything else gets one device
/// `gpu-0` whose request name carries a subrequest suffix and whose share id is set.
/// While `gate` has no permits, calls wait for one.
pub struct RecordingDriver {
    pub calls: Mutex<Vec<Call>>,
    pub health: Option<watch::Sender<Vec<DeviceHealth>>>,
    pub gate: Option<Arc<Semaphore>>,
}

impl RecordingDriver {
    pub fn new() -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            health: None,
            gate: None,
        }
    }

    pub fn with_health(mut self, initial: Vec<DeviceHealth>) -> Self {
        self.health = Some(watch::channel(initial).0);
        self
    }

    pub fn with_gate(mut self, gate: Arc<Semaphore>) -> Self {
        self.gate = Some(gate);
        self
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    async fn pass_gate(&self) {
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate closed").forget();
        }
    }
}

pub fn cdi_id(claim: &ClaimRef) -> String {
    format!("{DRIVER}/claim={}-gpu-0", claim.uid)
}

impl DraDriver for RecordingDriver {
    type Error = String;

    async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Prepare(claims.clone()));
        self.pass_gate().await;
        let mut results = BTreeMap::new();
        for claim in claims {
            if claim.name == "panic" {
                panic!("the fake driver panics on request");
            }
            if claim.name.starts_with("forget-") {
                continue;
            }
            let result = if claim.name.starts_with("fail-") {
                Err(format!("claim {claim}: device gpu-9 is not on this node"))
            } else {
                Ok(vec![PreparedDevice {
                    request_names: vec!["gpu/large".into()],
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec![cdi_id(&claim)],
                    share_id: Some("share-1".into()),
                }])
            };
            results.insert(claim.uid, result);
        }
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, UnprepareResult> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Unprepare(claims.clone()));
        self.pass_gate().await;
        claims
            .into_iter()
            .map(|claim| {
                let result = if claim.name.starts_with("fail-") {
                    Err(format!("claim {claim}: cannot remove its CDI spec"))
                } else {
                    Ok(())
                };
                (claim.uid, result)
            })
            .collect()
    }

    fn device_health(&self) -> Option<watch::Receiver<Vec<DeviceHealth>>> {
        self.health.as_ref().map(watch::Sender::subscribe)
    }
}

/// A plugin served from a temporary kubelet directory.
pub struct ServedPlugin {
    /// The temporary kubelet directory, if this plugin owns it.
    _root: Option<tempfile::TempDir>,
    pub driver: Arc<RecordingDriver>,
    pub registration_socket: PathBuf,
    pub dra_socket: PathBuf,
    pub registration_state: watch::Receiver<tessera_kubelet_grpc::RegistrationState>,
    pub supported_services: Vec<String>,
    shutdown: Option<oneshot::Sender<()>>,
    serving: Option<JoinHandle<Result<(), ServeError>>>,
}

pub fn config(root: &Path) -> PluginConfig {
    PluginConfig::new(DRIVER)
        .registrar_dir(root.join("plugins_registry"))
        .plugins_dir(root.join("plugins"))
}

impl ServedPlugin {
    pub fn start(driver: RecordingDriver) -> Self {
        let root = tempfile::tempdir().unwrap();
        let config = config(root.path());
        Self::start_with(Some(root), config, driver)
    }

    /// Serves `driver` as `config` says; `root` is kept alive as long as the plugin.
    pub fn start_with(
        root: Option<tempfile::TempDir>,
        config: PluginConfig,
        driver: RecordingDriver,
    ) -> Self {
        let driver = Arc::new(driver);
        let plugin: KubeletPlugin<RecordingDriver> = config.bind(Arc::clone(&driver)).unwrap();
        let paths = plugin.socket_paths().clone();
        let registration_state = plugin.registration_state();
        let supported_services = plugin.supported_services().to_vec();
        let (shutdown, stop) = oneshot::channel::<()>();
        let serving = tokio::spawn(plugin.serve(async {
            let _ = stop.await;
        }));
        Self {
            _root: root,
            driver,
            registration_socket: paths.registration,
            dra_socket: paths.dra,
            registration_state,
            supported_services,
            shutdown: Some(shutdown),
            serving: Some(serving),
        }
    }

    /// Sends the shutdown signal without waiting.
    pub fn signal_shutdown(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    /// Sends the shutdown signal and waits for `serve` to return.
    pub async fn stop(&mut self) -> Result<(), ServeError> {
        self.signal_shutdown();
        let serving = self.serving.take().expect("already stopped");
        tokio::time::timeout(Duration::from_secs(10), serving)
            .await
            .expect("serve did not return within 10 s of the shutdown signal")
            .expect("serve panicked")
    }
}

/// Polls `condition` every 10 ms for up to 5 s.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}
