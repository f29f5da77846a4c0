//! Running `tessera-kubelet-plugin` as a process against the API-server fake over HTTP, with
//! its own temporary kubelet, CDI and state directories.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::ObjectMeta;
use tessera_fake_apiserver::{FakeApiServer, HttpServer};
use tessera_kubelet_grpc::simulator::KubeletSimulator;

pub const NODE: &str = "node-a";
pub const MANAGED_LABEL: &str = "gpu.tessera.dev/topology-managed";

/// Directories one plugin instance (and its restarts) uses.
pub struct PluginDirs {
    pub root: tempfile::TempDir,
}

impl PluginDirs {
    pub fn new() -> Self {
        Self::under(Path::new("/tmp"))
    }

    /// Directories under `parent` (short: unix socket paths are limited to 107 bytes).
    pub fn under(parent: &Path) -> Self {
        Self {
            root: tempfile::Builder::new()
                .prefix("tkp")
                .tempdir_in(parent)
                .unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.path("reg").join("gpu.tessera.dev-reg.sock")
    }
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running plugin process; killed when dropped.
pub struct PluginProcess {
    /// Shared so that another thread can SIGKILL it while a test awaits a call.
    pub child: Arc<Mutex<Child>>,
    pub metrics_port: u16,
}

impl PluginProcess {
    /// Starts the plugin; `backend` are the device flags (e.g. `--topology dgx-h100`).
    pub fn start(
        kubeconfig: &Path,
        dirs: &PluginDirs,
        backend: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        Self::start_in_shell(kubeconfig, dirs, backend, env, "")
    }

    /// Starts the plugin through `sh -c '<setup> exec plugin …'`, e.g. with `ulimit -n 1024;`
    /// or `umask 000;` as `setup`; the process is the plugin itself (`exec`).
    pub fn start_in_shell(
        kubeconfig: &Path,
        dirs: &PluginDirs,
        backend: &[&str],
        env: &[(&str, String)],
        setup: &str,
    ) -> Self {
        let metrics_port = free_port();
        let log = std::fs::File::create(dirs.path(&format!("plugin-{metrics_port}.log"))).unwrap();
        let mut command = if setup.is_empty() {
            Command::new(env!("CARGO_BIN_EXE_tessera-kubelet-plugin"))
        } else {
            let mut shell = Command::new("sh");
            shell
                .arg("-c")
                .arg(format!("{setup} exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_tessera-kubelet-plugin"));
            shell
        };
        let child = command
            .args(["--node-name", NODE])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--kubelet-registrar-directory-path")
            .arg(dirs.path("reg"))
            .arg("--kubelet-plugins-directory-path")
            .arg(dirs.path("plugins"))
            .arg("--cdi-root")
            .arg(dirs.path("cdi"))
            .arg("--state-dir")
            .arg(dirs.path("state"))
            .args(["--rescan-interval", "200ms"])
            .args(["--shutdown-grace", "5s"])
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(backend)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start tessera-kubelet-plugin");
        Self {
            child: Arc::new(Mutex::new(child)),
            metrics_port,
        }
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends SIGKILL (if it still runs) and waits for the process to exit.
    pub fn kill(&self) -> ExitStatus {
        let mut child = self.child();
        let _ = child.kill();
        child.wait().expect("wait for the plugin")
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(self) -> ExitStatus {
        let pid = self.child().id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child().try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the plugin did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    /// `GET path` on the metrics address: (status code, body); `None` if nothing listens yet.
    pub async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let code = response.get(9..12)?.parse().ok()?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((code, body))
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let mut child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `timeout` with `what` and
/// the plugin's log.
pub async fn eventually<T>(
    dirs: &PluginDirs,
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}\n--- plugin logs\n{}",
                plugin_logs(dirs)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every plugin log in `dirs`, for failure messages.
pub fn plugin_logs(dirs: &PluginDirs) -> String {
    let mut logs: Vec<_> = std::fs::read_dir(dirs.root.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.iter()
        .map(|p| {
            format!(
                "== {}\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            )
        })
        .collect()
}

/// Registers with the plugin as the kubelet does, once its registration socket exists.
pub async fn register(dirs: &PluginDirs) -> KubeletSimulator {
    let socket = dirs.registration_socket();
    eventually(
        dirs,
        "the plugin to register",
        Duration::from_secs(30),
        async || {
            if !socket.exists() {
                return None;
            }
            KubeletSimulator::register(&socket).await.ok()
        },
    )
    .await
}

/// An API-server fake serving over HTTP (a plugin process reaches it through the kubeconfig
/// `http.kubeconfig_path()` names) with this node in it.
pub async fn api_server_with_node() -> (FakeApiServer, HttpServer, Node) {
    let server = FakeApiServer::new();
    let http = server.serve_http().await.unwrap();
    let node = seed_node(&server);
    (server, http, node)
}

pub fn seed_node(server: &FakeApiServer) -> Node {
    server.seed(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    })
}

/// This node's slices.
pub fn own_slices(server: &FakeApiServer) -> Vec<ResourceSlice> {
    server
        .list::<ResourceSlice>(None)
        .into_iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(NODE))
        .collect()
}

pub fn devices(slices: &[ResourceSlice]) -> Vec<&k8s_openapi::api::resource::v1::Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect()
}
