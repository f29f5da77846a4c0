//! `tessera-kubelet-plugin` on a real NVIDIA node. Ignored everywhere else: run it as root on a
//! GPU machine, after building every binary of the workspace in the same profile:
//!
//! ```text
//! cargo build --release --bins
//! TESSERA_REAL_DRIVER_ROOT=/usr/local/nvidia NVML_LIB=/usr/local/nvidia/lib64/libnvidia-ml.so.1 \
//!   cargo test --release -p tessera-node --test real_gpu -- --ignored --nocapture --test-threads=1
//! ```
//!
//! The plugin inherits `NVML_LIB` (its `--nvml-lib`) and `NVIDIA_DEV_ROOT` (its `--dev-root`,
//! `/` by default). On a machine without a GPU the same run against a fake driver root checks the
//! test itself: lay one out with `tessera-fake-driver-root --layout gke --node-name node-a`
//! (crates/fake-driver) and point the three variables at it.
//!
//! The plugin runs its NVML backend against the driver (API server fake and kubelet simulator as
//! in the other process tests). A claim's CDI spec is then applied to a root filesystem the way a
//! container runtime applies one — bind mounts, device nodes, env, the `createContainer` hook —
//! and `tessera-gpu-check`, chrooted there, must see exactly the claimed GPU through CUDA, NVML
//! and `nvidia-smi`. The MPS test checks the daemon the plugin starts from the driver root and
//! what a client sees of it; the time-slicing test, that the driver's setting changes for the
//! claim and comes back after it. Each test prints the spec and the checker's report, so a run on
//! new hardware is also a record of it.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::ResourceExt;
use serde_json::{Value, json};
use support::harness::{allocated_claim, claim_config};
use support::process::*;
use tessera_fake_apiserver::FakeApiServer;
use tessera_kubelet::ClaimRef;
use tessera_kubelet::simulator::KubeletSimulator;

const WAIT: Duration = Duration::from_secs(60);

fn driver_root() -> String {
    std::env::var("TESSERA_REAL_DRIVER_ROOT").expect(
        "TESSERA_REAL_DRIVER_ROOT=<the node's NVIDIA driver root, e.g. / or /usr/local/nvidia>",
    )
}

/// A binary built next to the plugin (`cargo build --bins` in the same profile).
fn sibling(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_tessera-kubelet-plugin")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` in the same profile first",
        path.display()
    );
    path
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// The plugin on the real driver, registered with a simulated kubelet.
struct RealNode {
    server: FakeApiServer,
    dirs: PluginDirs,
    _plugin: PluginProcess,
    kubelet: KubeletSimulator,
    _http: tessera_fake_apiserver::HttpServer,
}

impl RealNode {
    async fn start() -> RealNode {
        let server = FakeApiServer::new();
        let http = server.serve_http().await.unwrap();
        seed_node(&server);
        let dirs = PluginDirs::new();
        let root = driver_root();
        let plugin = PluginProcess::start(
            http.kubeconfig_path(),
            &dirs,
            &["--driver-root", &root],
            &[],
        );
        let kubelet = register(&dirs).await;
        RealNode {
            server,
            dirs,
            _plugin: plugin,
            kubelet,
            _http: http,
        }
    }

    /// The published GPUs: (device name, UUID), in name order.
    async fn gpus(&self) -> Vec<(String, String)> {
        let slices = eventually(&self.dirs, "the node's slices", WAIT, async || {
            let slices = own_slices(&self.server);
            (!slices.is_empty()).then_some(slices)
        })
        .await;
        let mut gpus: Vec<(String, String)> = devices(&slices)
            .into_iter()
            .filter(|d| d.name.starts_with("gpu-"))
            .filter_map(|d| {
                let uuid = d.attributes.as_ref()?.get("uuid")?.string.clone()?;
                Some((d.name.clone(), uuid))
            })
            .collect();
        gpus.sort();
        println!("published GPUs: {gpus:?}");
        gpus
    }

    async fn prepare(&self, name: &str, device: &str, configs: Vec<Value>) -> (ClaimRef, Value) {
        let claim = self
            .server
            .seed(&allocated_claim(name, &[("gpu", device)], configs));
        let reference = ClaimRef::new("ml", name, claim.uid().unwrap());
        let prepared = self
            .kubelet
            .prepare(std::slice::from_ref(&reference))
            .await
            .unwrap();
        assert!(
            prepared[&reference.uid].is_ok(),
            "{prepared:?}\n{}",
            plugin_logs(&self.dirs)
        );
        let spec = spec_of(&self.dirs);
        println!("spec of {name}: {spec}");
        let parsed: tessera_cdi::Spec = serde_json::from_value(spec.clone()).unwrap();
        parsed.validate().unwrap();
        (reference, spec)
    }

    async fn unprepare(&self, reference: &ClaimRef) {
        let unprepared = self
            .kubelet
            .unprepare(std::slice::from_ref(reference))
            .await
            .unwrap();
        assert!(
            unprepared[&reference.uid].is_ok(),
            "{unprepared:?}\n{}",
            plugin_logs(&self.dirs)
        );
    }
}

fn spec_of(dirs: &PluginDirs) -> Value {
    let entry = std::fs::read_dir(dirs.path("cdi"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .expect("a CDI spec");
    serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap()
}

/// A root filesystem with a CDI spec applied to it as a runtime would; unmounted when dropped.
struct ContainerRoot {
    dir: tempfile::TempDir,
    mounts: Vec<PathBuf>,
    env: Vec<String>,
}

impl ContainerRoot {
    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    fn inside(&self, path: &str) -> PathBuf {
        self.rootfs().join(path.trim_start_matches('/'))
    }

    fn bind(&mut self, host: &Path, at: &str, read_only: bool) {
        let target = self.inside(at);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        if host.is_dir() {
            std::fs::create_dir_all(&target).unwrap();
        } else if !target.exists() {
            std::fs::write(&target, b"").unwrap();
        }
        let (host, target) = (host.display().to_string(), target.display().to_string());
        run("mount", &["--bind", &host, &target]);
        self.mounts.push(target.clone().into());
        if read_only {
            run("mount", &["-o", "remount,bind,ro", &target]);
        }
    }

    fn copy(&self, host: &Path) {
        let target = self.inside(&host.display().to_string());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(host, target).unwrap();
    }

    /// The checker, its loader and libraries, /proc and /sys, and the spec's edits.
    fn with_spec(spec: &Value) -> ContainerRoot {
        let mut root = ContainerRoot {
            dir: tempfile::tempdir().unwrap(),
            mounts: Vec::new(),
            env: Vec::new(),
        };
        for dir in ["etc", "tmp", "proc", "sys", "dev"] {
            std::fs::create_dir_all(root.inside(dir)).unwrap();
        }
        let checker = sibling("tessera-gpu-check");
        std::fs::create_dir_all(root.inside("/usr/bin")).unwrap();
        std::fs::copy(&checker, root.inside("/usr/bin/tessera-gpu-check")).unwrap();
        run(
            "mount",
            &[
                "-t",
                "proc",
                "proc",
                &root.inside("/proc").display().to_string(),
            ],
        );
        root.mounts.push(root.inside("/proc"));
        root.bind(Path::new("/sys"), "/sys", true);
        // The device nodes every OCI runtime gives a container.
        for device in ["/dev/null", "/dev/zero", "/dev/urandom"] {
            root.bind(Path::new(device), device, false);
        }

        let mut edits = vec![&spec["containerEdits"]];
        edits.extend(
            spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| &d["containerEdits"]),
        );
        let mut libraries_of = vec![checker];
        for edit in &edits {
            for node in edit["deviceNodes"].as_array().into_iter().flatten() {
                let path = node["path"].as_str().unwrap();
                let host = node["hostPath"].as_str().unwrap_or(path);
                root.bind(Path::new(host), path, false);
            }
            for mount in edit["mounts"].as_array().into_iter().flatten() {
                let host = PathBuf::from(mount["hostPath"].as_str().unwrap());
                let at = mount["containerPath"].as_str().unwrap();
                let read_only = mount["options"]
                    .as_array()
                    .is_some_and(|o| o.contains(&json!("ro")));
                root.bind(&host, at, read_only);
                if host.is_file() {
                    libraries_of.push(host);
                }
            }
            for env in edit["env"].as_array().into_iter().flatten() {
                root.env.push(env.as_str().unwrap().to_owned());
            }
        }
        // What the image would hold: the C library and the loader the checker and the driver's
        // files need (a real image has them; this root starts empty).
        for binary in libraries_of {
            for library in needed_libraries(&binary) {
                if !root.inside(&library.display().to_string()).exists() {
                    root.copy(&library);
                }
            }
        }
        for edit in &edits {
            for hook in edit["hooks"].as_array().into_iter().flatten() {
                root.run_hook(hook);
            }
        }
        root
    }

    /// Runs a `createContainer` hook as runc does: the container's state on stdin, its bundle's
    /// config.json naming the root filesystem.
    fn run_hook(&self, hook: &Value) {
        assert_eq!(hook["hookName"], "createContainer", "{hook}");
        let bundle = self.dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        let config = json!({"ociVersion": "1.2.0", "root": {"path": self.rootfs()}});
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        let state = json!({"ociVersion": "1.2.0", "id": "real-gpu", "status": "created",
            "pid": std::process::id(), "bundle": bundle});
        let args: Vec<&str> = hook["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let mut child = Command::new(hook["path"].as_str().unwrap())
            .args(&args[1..])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.to_string().as_bytes())
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "hook {hook}: {status}");
    }

    /// `tessera-gpu-check` in this root with the spec's env; its one-line report.
    fn check(&self) -> Value {
        let chroot = ["/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("chroot (coreutils)");
        let output = Command::new(chroot)
            .arg(self.rootfs())
            .arg("/usr/bin/tessera-gpu-check")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(self.env.iter().map(|e| e.split_once('=').unwrap()))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        println!("checker: {report}");
        report
    }
}

impl Drop for ContainerRoot {
    fn drop(&mut self) {
        for target in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(target).status();
        }
    }
}

/// The libraries `binary` needs, as `ldd` resolves them on this machine.
fn needed_libraries(binary: &Path) -> Vec<PathBuf> {
    let output = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let path = line
                .split("=>")
                .nth(1)
                .unwrap_or(line)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn uuids(report: &Value, pointer: &str) -> Vec<String> {
    report
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} in {report}"))
        .iter()
        .map(|d| d["uuid"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real NVIDIA GPU and root: see the module docs"]
async fn a_claimed_gpu_is_all_a_container_sees() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    assert!(!gpus.is_empty(), "no GPU published");
    let (device, uuid) = gpus[0].clone();
    let (reference, spec) = node.prepare("whole", &device, Vec::new()).await;

    let root = ContainerRoot::with_spec(&spec);
    let report = root.check();
    assert_eq!(report["cuda"]["init"], "CUDA_SUCCESS", "{report}");
    assert_eq!(uuids(&report, "/cuda/devices"), vec![uuid.clone()]);
    assert_eq!(uuids(&report, "/nvml/gpus"), vec![uuid.clone()]);
    assert_eq!(report["nvidiaSmi"]["exitCode"], 0, "{report}");
    let smi = report["nvidiaSmi"]["lines"].to_string();
    assert!(smi.contains(&uuid), "{smi}");
    drop(root);

    node.unprepare(&reference).await;
    assert_eq!(std::fs::read_dir(node.dirs.path("cdi")).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real NVIDIA GPU and root: see the module docs"]
async fn an_mps_claim_runs_the_drivers_daemon_and_its_clients_see_the_limits() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    let (device, uuid) = gpus[0].clone();
    let config = claim_config(
        &["gpu"],
        "GpuConfig",
        json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25,
            "defaultPinnedDeviceMemoryLimit": "1Gi"}}),
    );
    let (reference, spec) = node.prepare("mps", &device, vec![config]).await;
    let root = ContainerRoot::with_spec(&spec);
    let report = root.check();
    assert_eq!(uuids(&report, "/cuda/devices"), vec![uuid.clone()]);
    let cuda = &report["cuda"]["devices"][0];
    assert_eq!(cuda["mpsEnabled"], true, "{report}");
    assert_eq!(report["mps"]["controlPresent"], true, "{report}");
    assert_eq!(report["mps"]["activeThreadPercentage"], "25.0", "{report}");
    drop(root);

    node.unprepare(&reference).await;
    assert!(
        !Command::new("pgrep")
            .args(["-f", "nvidia-cuda-mps-control"])
            .status()
            .unwrap()
            .success(),
        "an MPS control daemon still runs after unprepare"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real NVIDIA GPU and root: see the module docs"]
async fn a_time_slicing_claim_sets_and_restores_the_drivers_time_slice() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    let (device, uuid) = gpus[0].clone();
    let smi = Path::new(&driver_root()).join("bin/nvidia-smi");
    let smi = if smi.exists() {
        smi
    } else {
        Path::new(&driver_root()).join("usr/bin/nvidia-smi")
    };
    let policy = || {
        // As the plugin runs it: the driver's library directory on the loader's path.
        let library_dir = std::env::var("NVML_LIB")
            .ok()
            .and_then(|lib| Some(Path::new(&lib).parent()?.display().to_string()))
            .unwrap_or_default();
        let output = Command::new(&smi)
            .args(["compute-policy", "-l", "-i", &uuid])
            .env("LD_LIBRARY_PATH", library_dir)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr)
    };
    let before = policy();
    println!("before: {before}");
    let config = claim_config(
        &["gpu"],
        "GpuConfig",
        json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    );
    let (reference, _spec) = node.prepare("sliced", &device, vec![config]).await;
    let during = policy();
    println!("during: {during}");
    node.unprepare(&reference).await;
    let after = policy();
    println!("after: {after}");
    assert_ne!(before, during, "the claim's time slice was not visible");
    assert_eq!(before, after, "unprepare did not restore the time slice");
}
