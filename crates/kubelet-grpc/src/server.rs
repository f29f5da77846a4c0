//! Serving a [`DraDriver`] to the kubelet: [`PluginConfig`] lays out and binds the sockets,
//! [`KubeletPlugin::serve`] runs the gRPC servers until a shutdown signal, then drains them
//! and removes the sockets.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::authority::LenientAuthority;
use crate::dra_service::{ClaimCalls, DraV1Service, DraV1beta1Service};
use crate::driver::{DeviceHealth, DraDriver};
use crate::health::{HealthFeed, HealthV1Service, HealthV1alpha1Service};
use crate::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration as reg_pb};
use crate::registration::{
    DRA_PLUGIN_V1, DRA_PLUGIN_V1BETA1, DRA_RESOURCE_HEALTH_V1, DRA_RESOURCE_HEALTH_V1ALPHA1,
    PLUGIN_TYPE_DRA, RegistrationService, RegistrationState,
};
use crate::socket::{
    BoundSocket, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR, DEFAULT_SOCKET_MODE, OwnedSocketPath,
    SocketError, SocketPaths, remove_dead_sockets,
};
use crate::stop::{StopSignal, StopTrigger, stop_signal};

/// Default time in-flight calls get to finish after the shutdown signal.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Failures while starting, serving or stopping the plugin.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The sockets could not be laid out, created or removed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// A socket could not be handed to the async runtime.
    #[error("cannot hand socket {path} to the tokio runtime: {source}")]
    Runtime {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A gRPC server stopped with an error.
    #[error("the {server} gRPC server on {path} failed: {source}")]
    Server {
        /// `registration` or `DRA`.
        server: &'static str,
        /// Its socket.
        path: PathBuf,
        /// The underlying error.
        source: tonic::transport::Error,
    },
    /// A gRPC server task panicked.
    #[error("the {server} gRPC server on {path} panicked: {message}")]
    ServerPanicked {
        /// `registration` or `DRA`.
        server: &'static str,
        /// Its socket.
        path: PathBuf,
        /// The panic, as the runtime reports it.
        message: String,
    },
    /// In-flight calls did not finish within the shutdown grace period and were cut off.
    #[error(
        "calls on {path} were still running {grace:?} after the shutdown signal and were cut off; \
         the kubelet retries them against the next plugin instance"
    )]
    DrainTimedOut {
        /// The DRA socket.
        path: PathBuf,
        /// The grace period.
        grace: Duration,
    },
}

/// How to serve a driver to the kubelet. Defaults match the kubelet's defaults.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    driver_name: String,
    registrar_dir: PathBuf,
    plugins_dir: PathBuf,
    rolling_update_pod_uid: Option<String>,
    serialize_calls: bool,
    socket_mode: u32,
    shutdown_grace: Duration,
}

impl PluginConfig {
    /// A configuration for `driver_name` (e.g. `gpu.tessera.dev`) with the kubelet's default
    /// directories, no rolling update, serialized calls, socket mode 0600 and a 30 s drain.
    pub fn new(driver_name: impl Into<String>) -> Self {
        Self {
            driver_name: driver_name.into(),
            registrar_dir: PathBuf::from(DEFAULT_REGISTRAR_DIR),
            plugins_dir: PathBuf::from(DEFAULT_PLUGINS_DIR),
            rolling_update_pod_uid: None,
            serialize_calls: true,
            socket_mode: DEFAULT_SOCKET_MODE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }

    /// The directory the kubelet watches for registration sockets
    /// (`--kubelet-registrar-directory-path`).
    pub fn registrar_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registrar_dir = dir.into();
        self
    }

    /// The kubelet's plugins directory (`--kubelet-plugins-directory-path`); the DRA socket
    /// goes into `<dir>/<driver name>/`.
    pub fn plugins_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugins_dir = dir.into();
        self
    }

    /// Per-pod socket names, so that two plugin pods can serve side by side during a
    /// DaemonSet rolling update (kubelet 1.33+). `pod_uid` is the pod's `metadata.uid`.
    /// The driver must then keep no state across calls outside shared storage.
    pub fn rolling_update(mut self, pod_uid: impl Into<String>) -> Self {
        self.rolling_update_pod_uid = Some(pod_uid.into());
        self
    }

    /// Whether prepare and unprepare calls run one at a time (default: yes). Turn it off only
    /// if the driver is safe under concurrent calls.
    pub fn serialize_calls(mut self, serialize: bool) -> Self {
        self.serialize_calls = serialize;
        self
    }

    /// Permission bits of both sockets (default 0600: the kubelet runs as root).
    pub fn socket_mode(mut self, mode: u32) -> Self {
        self.socket_mode = mode;
        self
    }

    /// How long in-flight calls may run after the shutdown signal before they are cut off.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Where the sockets go, without touching the file system (except to make relative
    /// directories absolute).
    pub fn socket_paths(&self) -> Result<SocketPaths, SocketError> {
        SocketPaths::new(
            &self.driver_name,
            &self.registrar_dir,
            &self.plugins_dir,
            self.rolling_update_pod_uid.as_deref(),
        )
    }

    /// Creates the socket directories, removes stale sockets and listens on both sockets
    /// (DRA first, so that the kubelet never finds a registration socket whose DRA socket
    /// is missing). Calls are accepted once [`KubeletPlugin::serve`] runs.
    pub fn bind<D: DraDriver>(self, driver: Arc<D>) -> Result<KubeletPlugin<D>, ServeError> {
        let paths = self.socket_paths()?;
        let health = driver.device_health();
        let mut supported_services = vec![DRA_PLUGIN_V1.to_owned(), DRA_PLUGIN_V1BETA1.to_owned()];
        if health.is_some() {
            supported_services.push(DRA_RESOURCE_HEALTH_V1.to_owned());
            supported_services.push(DRA_RESOURCE_HEALTH_V1ALPHA1.to_owned());
        }
        if self.rolling_update_pod_uid.is_some() {
            let dra_dir = paths.dra.parent().unwrap_or(Path::new("/"));
            let registrar_dir = paths.registration.parent().unwrap_or(Path::new("/"));
            for removed in remove_dead_sockets(&self.driver_name, &paths, registrar_dir, dra_dir) {
                tracing::info!(path = %removed.display(), "removed the socket of a plugin instance that is gone");
            }
        }
        let dra_socket = BoundSocket::bind(&paths.dra, self.socket_mode)?;
        let registration_socket = BoundSocket::bind(&paths.registration, self.socket_mode)?;
        let (registration_state, _) = watch::channel(RegistrationState::Pending);
        let (cut_off, cut_off_signal) = stop_signal();
        tracing::info!(
            driver = %self.driver_name,
            registration = %paths.registration.display(),
            dra = %paths.dra.display(),
            services = ?supported_services,
            "plugin sockets ready"
        );
        Ok(KubeletPlugin {
            driver_name: self.driver_name,
            paths,
            supported_services,
            calls: Arc::new(ClaimCalls::new(
                driver,
                self.serialize_calls,
                cut_off_signal,
            )),
            cut_off,
            health,
            dra_socket,
            registration_socket,
            registration_state,
            shutdown_grace: self.shutdown_grace,
        })
    }
}

/// A driver bound to its sockets, ready to serve. Dropping it without serving leaves the
/// socket files behind; the next start removes them as stale.
pub struct KubeletPlugin<D> {
    driver_name: String,
    paths: SocketPaths,
    supported_services: Vec<String>,
    calls: Arc<ClaimCalls<D>>,
    /// Makes calls still waiting for the driver give up once the grace period is over.
    cut_off: StopTrigger,
    health: Option<watch::Receiver<Vec<DeviceHealth>>>,
    dra_socket: BoundSocket,
    registration_socket: BoundSocket,
    registration_state: watch::Sender<RegistrationState>,
    shutdown_grace: Duration,
}

impl<D> std::fmt::Debug for KubeletPlugin<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletPlugin")
            .field("driver_name", &self.driver_name)
            .field("paths", &self.paths)
            .field("supported_services", &self.supported_services)
            .finish_non_exhaustive()
    }
}

impl<D: DraDriver> KubeletPlugin<D> {
    /// The sockets this plugin listens on.
    pub fn socket_paths(&self) -> &SocketPaths {
        &self.paths
    }

    /// What `GetInfo` advertises in `supported_versions`, preferred first.
    pub fn supported_services(&self) -> &[String] {
        &self.supported_services
    }

    /// The kubelet's registration verdict, updated on every `NotifyRegistrationStatus`
    /// (the kubelet registers again after it restarts). Use it for readiness.
    pub fn registration_state(&self) -> watch::Receiver<RegistrationState> {
        self.registration_state.subscribe()
    }

    /// Serves the registration and DRA sockets until `shutdown` completes, then:
    /// stops the registration server and removes its socket (the kubelet deregisters the
    /// plugin), stops accepting DRA calls, ends health streams, lets in-flight calls finish
    /// within the grace period, and removes the DRA socket.
    ///
    /// Must run inside a tokio runtime. Returns early with an error if a server fails.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let (stop_registration, registration_stopped) = stop_signal();
        let (stop_dra, dra_stopped) = stop_signal();
        let (registration_listener, registration_socket) = self.registration_socket.into_parts();
        let (dra_listener, dra_socket) = self.dra_socket.into_parts();
        let registration_listener = to_tokio(registration_listener, &registration_socket)?;
        let dra_listener = to_tokio(dra_listener, &dra_socket)?;

        let info = reg_pb::PluginInfo {
            r#type: PLUGIN_TYPE_DRA.to_owned(),
            name: self.driver_name.clone(),
            endpoint: self.paths.dra.to_string_lossy().into_owned(),
            supported_versions: self.supported_services.clone(),
        };
        let registration_service = RegistrationService::new(info, self.registration_state.clone());
        let mut running = Servers {
            registration: Some(spawn_registration_server(
                registration_service,
                registration_listener,
                registration_stopped,
            )),
            dra: Some(spawn_dra_server(
                &self.calls,
                self.health,
                dra_listener,
                dra_stopped,
            )),
            registration_path: registration_socket.path.clone(),
            dra_path: dra_socket.path.clone(),
        };

        let failure = tokio::select! {
            () = shutdown => {
                tracing::info!(driver = %self.driver_name, "shutting down the kubelet plugin");
                None
            }
            (server, outcome) = running.first_exit() => {
                tracing::error!(server, "a gRPC server stopped on its own; shutting down");
                outcome.err()
            }
        };

        // 1. Registration: the kubelet sees the socket vanish and deregisters the plugin.
        stop_registration.stop();
        let registration_result = running.finish_registration(self.shutdown_grace).await;
        let registration_removed = registration_socket.remove();

        // 2. DRA: no new calls, health streams end, in-flight calls finish or are cut off.
        stop_dra.stop();
        let dra_result = running.finish_dra(self.shutdown_grace, &self.cut_off).await;
        let dra_removed = dra_socket.remove();
        tracing::info!(driver = %self.driver_name, "kubelet plugin stopped");

        if let Some(failure) = failure {
            return Err(failure);
        }
        registration_result?;
        dra_result?;
        registration_removed?;
        dra_removed?;
        Ok(())
    }
}

/// Serves the registration service until `stop`. The kubelet's registration calls carry the
/// socket path as `:authority`, which h2 refuses; [`LenientAuthority`] makes them acceptable.
fn spawn_registration_server(
    service: RegistrationService,
    listener: UnixListener,
    stop: StopSignal,
) -> ServerTask {
    let router = Server::builder().add_service(
        reg_pb::registration_server::RegistrationServer::new(service),
    );
    let incoming =
        UnixListenerStream::new(listener).map(|stream| stream.map(LenientAuthority::new));
    tokio::spawn(router.serve_with_incoming_shutdown(incoming, stop.stopped()))
}

/// Serves both DRA versions, and both health versions when there is a health feed, until
/// `stop` (which also ends the health streams).
fn spawn_dra_server<D: DraDriver>(
    calls: &Arc<ClaimCalls<D>>,
    health: Option<watch::Receiver<Vec<DeviceHealth>>>,
    listener: UnixListener,
    stop: StopSignal,
) -> ServerTask {
    let feed = health.map(|updates| HealthFeed {
        updates,
        stop: stop.clone(),
    });
    let health_v1 = feed.clone().map(|feed| {
        health_v1::dra_resource_health_server::DraResourceHealthServer::new(HealthV1Service(feed))
    });
    let health_v1alpha1 = feed.map(|feed| {
        health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
            HealthV1alpha1Service(feed),
        )
    });
    let router = Server::builder()
        .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(
            DraV1Service(Arc::clone(calls)),
        ))
        .add_service(dra_v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1beta1Service(Arc::clone(calls)),
        ))
        .add_optional_service(health_v1)
        .add_optional_service(health_v1alpha1);
    tokio::spawn(
        router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.stopped()),
    )
}

fn to_tokio(
    listener: std::os::unix::net::UnixListener,
    socket: &OwnedSocketPath,
) -> Result<UnixListener, ServeError> {
    UnixListener::from_std(listener).map_err(|source| ServeError::Runtime {
        path: socket.path.clone(),
        source,
    })
}

type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// The two running server tasks; each is taken once it has finished.
struct Servers {
    registration: Option<ServerTask>,
    dra: Option<ServerTask>,
    registration_path: PathBuf,
    dra_path: PathBuf,
}

impl Servers {
    /// Waits for whichever server stops first (only on failure: neither stops by itself
    /// before the shutdown signal) and reports which one.
    async fn first_exit(&mut self) -> (&'static str, Result<(), ServeError>) {
        let (Some(registration), Some(dra)) = (self.registration.as_mut(), self.dra.as_mut())
        else {
            return ("none", Ok(()));
        };
        tokio::select! {
            outcome = registration => {
                self.registration = None;
                ("registration", outcome_of("registration", self.registration_path.clone(), outcome))
            }
            outcome = dra => {
                self.dra = None;
                ("DRA", outcome_of("DRA", self.dra_path.clone(), outcome))
            }
        }
    }

    async fn finish_registration(&mut self, grace: Duration) -> Result<(), ServeError> {
        match self.registration.take() {
            Some(task) => finish("registration", task, &self.registration_path, grace, None).await,
            None => Ok(()),
        }
    }

    async fn finish_dra(
        &mut self,
        grace: Duration,
        cut_off: &StopTrigger,
    ) -> Result<(), ServeError> {
        match self.dra.take() {
            Some(task) => finish("DRA", task, &self.dra_path, grace, Some(cut_off)).await,
            None => Ok(()),
        }
    }
}

/// How long a server gets to close its connections after the cut-off before its task is
/// aborted. (Aborting the task does not end the connection tasks tonic spawned, so the cut-off,
/// which answers every waiting call, is what actually ends them.)
const AFTER_CUT_OFF: Duration = Duration::from_secs(2);

/// Waits up to `grace` for a stopping server; then fires `cut_off`, waits a little more and
/// aborts the server task.
async fn finish(
    server: &'static str,
    mut task: ServerTask,
    path: &std::path::Path,
    grace: Duration,
    cut_off: Option<&StopTrigger>,
) -> Result<(), ServeError> {
    if let Ok(outcome) = tokio::time::timeout(grace, &mut task).await {
        return outcome_of(server, path.to_owned(), outcome);
    }
    tracing::warn!(
        server,
        ?grace,
        "in-flight calls did not finish in time; cutting them off"
    );
    if let Some(cut_off) = cut_off {
        cut_off.stop();
    }
    if tokio::time::timeout(AFTER_CUT_OFF, &mut task)
        .await
        .is_err()
    {
        task.abort();
    }
    Err(ServeError::DrainTimedOut {
        path: path.to_owned(),
        grace,
    })
}

fn outcome_of(
    server: &'static str,
    path: PathBuf,
    outcome: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(ServeError::Server {
            server,
            path,
            source,
        }),
        Err(join_error) => Err(ServeError::ServerPanicked {
            server,
            path,
            message: join_error.to_string(),
        }),
    }
}
