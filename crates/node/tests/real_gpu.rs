//! `tessera-kubelet-plugin` on an NVIDIA driver through its NVML backend, the way a container
//! sees a claim: against a real GPU when one is named, and on every CI run against a fake driver
//! root (testing/fake-driver) so the code path is exercised without one.
//!
//! The plugin runs its NVML backend against the driver (API server fake and kubelet simulator as
//! in the other process tests). A claim's CDI spec is then applied to a root filesystem the way a
//! container runtime applies one — bind mounts, device nodes, env, the `createContainer` hook —
//! and `tessera-gpu-check`, chrooted there, must see exactly the claimed GPU through CUDA, NVML
//! and `nvidia-smi`. Each test claims the *last* GPU the node publishes, so a plugin that hands
//! out the first GPU whatever the claim says fails wherever there are several. The MPS test checks
//! the daemon the plugin starts from the driver root and what a client sees of it (the active
//! thread percentage and the pinned memory limit the claim asks for); the time-slicing test, that
//! `nvidia-smi compute-policy` succeeds and shows the claim's time slice (`Long`: 3) on the
//! claimed GPU only while the claim is prepared, and the old value after it. On a real GPU each
//! test prints the spec, the checker's report and `nvidia-smi`'s output, so a run on new hardware
//! is also a record of it.
//!
//! Both modes need root (bind mounts, chroot) and `tessera-gpu-check` and `tessera-cdi-hook` built
//! next to the plugin, in the same profile (`cargo test --workspace` builds them; so does
//! `cargo build --bins`). Without them the tests say so and pass, except under `CI=true`, where
//! they fail.
//!
//! **Fake driver (default).** `cargo test -p tessera-node --test real_gpu`: each test lays out a
//! driver root and device root for the plugin's node (the `dgx-h100` topology; fake-nvml, fake
//! CUDA, and this executable as the driver's `nvidia-smi` and MPS binaries, so it has its own
//! `main`) and gives the plugin `NVML_LIB` and `NVIDIA_DEV_ROOT` pointing into them.
//!
//! **Real GPU.** Name the node's driver root; the plugin inherits `NVML_LIB` (its `--nvml-lib`)
//! and `NVIDIA_DEV_ROOT` (its `--dev-root`, `/` by default). As root on the GPU machine:
//!
//! ```text
//! cargo build --release --bins
//! TESSERA_REAL_DRIVER_ROOT=/usr/local/nvidia NVML_LIB=/usr/local/nvidia/lib64/libnvidia-ml.so.1 \
//!   cargo test --release -p tessera-node --test real_gpu
//! ```
//!
//! A test name (or part of one) as the argument runs only the matching tests.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use kube::ResourceExt;
use serde_json::{Value, json};
use support::process::*;
use tessera_fake_apiserver::FakeApiServer;
use tessera_fake_driver::layout::{self, Artifacts, Layout, NodeKind};
use tessera_gpu_inventory::{DeviceSource, MockSource};
use tessera_kubelet_grpc::ClaimRef;
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_prepare_harness::{allocated_claim, claim_config};
use tessera_test_support::{harness, needed_libraries, running_as_root};

const WAIT: Duration = Duration::from_secs(60);

/// The variable naming a real driver root; unset, the tests run against a fake one.
const REAL_DRIVER_ROOT: &str = "TESSERA_REAL_DRIVER_ROOT";

/// The fake driver's node: the topology its GPUs come from.
const FAKE_TOPOLOGY: &str = "dgx-h100";

/// The binaries the tests run besides the plugin, built next to it.
const SIBLINGS: &[&str] = &["tessera-gpu-check", "tessera-cdi-hook"];

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

/// Prints what a run on real hardware records of it (specs, checker reports); against the
/// fake driver they are known and only make the log long.
fn record(what: &str, value: &Value) {
    if std::env::var_os(REAL_DRIVER_ROOT).is_some() {
        println!("{what}: {value}");
    }
}

/// Why these tests cannot run here (not root, a sibling binary missing), if so.
fn cannot_run() -> Option<String> {
    if !running_as_root() {
        return Some("bind mounts and chroot need root".to_owned());
    }
    let plugin = Path::new(env!("CARGO_BIN_EXE_tessera-kubelet-plugin"));
    SIBLINGS
        .iter()
        .find(|name| !plugin.with_file_name(name).exists())
        .map(|name| {
            format!("{name} is not built next to the plugin (cargo build --bins, same profile)")
        })
}

/// The driver the plugin runs on: the real one named by [`REAL_DRIVER_ROOT`], or a fake one laid
/// out for the test (removed when dropped).
enum Driver {
    Real {
        root: PathBuf,
    },
    Fake {
        _dir: tempfile::TempDir,
        root: PathBuf,
        dev_root: PathBuf,
        library_dir: PathBuf,
    },
}

impl Driver {
    fn new() -> Driver {
        if let Ok(root) = std::env::var(REAL_DRIVER_ROOT) {
            return Driver::Real { root: root.into() };
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver");
        let dev_root = dir.path().join("dev-root");
        let inventory = MockSource::new(FAKE_TOPOLOGY)
            .unwrap()
            .for_node(NODE)
            .inventory()
            .unwrap();
        layout::write_dev_root(&dev_root, &inventory, NodeKind::RegularFile).unwrap();
        let artifacts = Artifacts::of_test_executable().unwrap();
        let summary =
            layout::write_driver_root(&root, Layout::Host, NODE, &inventory, &dev_root, &artifacts)
                .unwrap();
        let library_dir = root.join(summary.library_dir.strip_prefix("/").unwrap());
        Driver::Fake {
            _dir: dir,
            root,
            dev_root,
            library_dir,
        }
    }

    fn root(&self) -> &Path {
        match self {
            Driver::Real { root } | Driver::Fake { root, .. } => root,
        }
    }

    /// What the plugin is given besides `--driver-root`: nothing for a real driver (it inherits
    /// `NVML_LIB` and `NVIDIA_DEV_ROOT`), the fake's NVML and device root otherwise.
    fn plugin_env(&self) -> Vec<(&'static str, String)> {
        match self {
            Driver::Real { .. } => Vec::new(),
            Driver::Fake {
                dev_root,
                library_dir,
                ..
            } => vec![
                (
                    "NVML_LIB",
                    library_dir.join("libnvidia-ml.so.1").display().to_string(),
                ),
                ("NVIDIA_DEV_ROOT", dev_root.display().to_string()),
            ],
        }
    }

    /// The directory holding the driver's libraries, as the plugin puts it on the loader's
    /// path for the driver's tools.
    fn library_dir(&self) -> String {
        match self {
            Driver::Real { .. } => std::env::var("NVML_LIB")
                .ok()
                .and_then(|lib| Some(Path::new(&lib).parent()?.display().to_string()))
                .unwrap_or_default(),
            Driver::Fake { library_dir, .. } => library_dir.display().to_string(),
        }
    }

    /// The driver's `nvidia-smi`.
    fn nvidia_smi(&self) -> PathBuf {
        ["bin/nvidia-smi", "usr/bin/nvidia-smi"]
            .iter()
            .map(|at| self.root().join(at))
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("no nvidia-smi in {}", self.root().display()))
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// The plugin on the driver, registered with a simulated kubelet.
struct RealNode {
    server: FakeApiServer,
    dirs: PluginDirs,
    _plugin: PluginProcess,
    kubelet: KubeletSimulator,
    _http: tessera_fake_apiserver::HttpServer,
    /// Last: a fake driver root is removed only after the plugin using it has stopped.
    driver: Driver,
}

impl RealNode {
    async fn start() -> RealNode {
        let (server, http, _) = api_server_with_node().await;
        let dirs = PluginDirs::new();
        let driver = Driver::new();
        let root = driver.root().display().to_string();
        let plugin = PluginProcess::start(
            http.kubeconfig_path(),
            &dirs,
            &["--driver-root", &root],
            &driver.plugin_env(),
        );
        let kubelet = register(&dirs).await;
        RealNode {
            server,
            dirs,
            _plugin: plugin,
            kubelet,
            _http: http,
            driver,
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
        record(&format!("spec of {name}"), &spec);
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
        record("checker", &report);
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

fn uuids(report: &Value, pointer: &str) -> Vec<String> {
    report
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} in {report}"))
        .iter()
        .map(|d| d["uuid"].as_str().unwrap().to_owned())
        .collect()
}

/// The GPU the tests claim: the last one published (name order), so that handing out the first
/// GPU whatever the claim says fails wherever there are several.
fn last_gpu(gpus: &[(String, String)]) -> (String, String) {
    let last = gpus.last().expect("no GPU published").clone();
    if gpus.len() > 1 {
        assert_ne!(last, gpus[0], "several GPUs, one name");
    }
    last
}

async fn a_claimed_gpu_is_all_a_container_sees() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    let (device, uuid) = last_gpu(&gpus);
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

async fn an_mps_claim_runs_the_drivers_daemon_and_its_clients_see_the_limits() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    let (device, uuid) = last_gpu(&gpus);
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
    // The claim's 1Gi, as `get_default_device_pinned_mem_limit` prints it for the client's only
    // device (the largest whole unit: an H200 with driver 580 printed `1G`).
    assert_eq!(
        report["mps"]["pinnedMemoryLimits"],
        json!({"0": "1G"}),
        "{report}"
    );
    assert_eq!(report["mps"]["error"], Value::Null, "{report}");
    drop(root);

    node.unprepare(&reference).await;
    let state = node.dirs.path("state").display().to_string();
    let daemons = processes_with_env_under("CUDA_MPS_PIPE_DIRECTORY", &state);
    assert!(
        daemons.is_empty(),
        "MPS processes of this plugin still run after unprepare: {daemons:?}"
    );
}

/// The processes whose environment sets `variable` to a path under `dir`: (pid, command line).
fn processes_with_env_under(variable: &str, dir: &str) -> Vec<(u32, String)> {
    let prefix = format!("{variable}={dir}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            environ
                .split(|&b| b == 0)
                .any(|var| var.starts_with(prefix.as_bytes()))
                .then(|| {
                    let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
                })
        })
        .collect()
}

/// `nvidia-smi compute-policy -l` as the plugin runs the driver's tools (its library directory on
/// the loader's path): the time slice of each GPU listed, by UUID. The tool must succeed.
fn time_slices(driver: &Driver) -> Vec<(String, String)> {
    let output = Command::new(driver.nvidia_smi())
        .args(["compute-policy", "-l"])
        .env("LD_LIBRARY_PATH", driver.library_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    println!("nvidia-smi compute-policy -l ({}):\n{text}", output.status);
    assert!(
        output.status.success(),
        "nvidia-smi compute-policy -l: {output:?}"
    );
    let slices = parse_time_slices(&text);
    assert!(
        !slices.is_empty(),
        "no time slice in nvidia-smi's output:\n{text}"
    );
    slices
}

/// `(uuid, value)` of each line naming a GPU UUID and its time slice, a number (`GPU 0 GPU-…: timeslice 3`,
/// as the fake driver prints it; never checked against a real driver's output, see
/// docs/operations.md, "What has run on real GPUs").
fn parse_time_slices(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let uuid = words.iter().find(|w| w.starts_with("GPU-"))?;
            let at = words
                .iter()
                .position(|w| w.trim_end_matches(':').eq_ignore_ascii_case("timeslice"))?;
            let value: u32 = words.get(at + 1)?.parse().ok()?;
            Some((uuid.trim_end_matches(':').to_owned(), value.to_string()))
        })
        .collect()
}

fn time_slices_are_read_per_gpu() {
    let text = "GPU 0 GPU-aaa: timeslice 0\nGPU 1 GPU-bbb: timeslice 3\nsomething else\n";
    assert_eq!(
        parse_time_slices(text),
        [
            ("GPU-aaa".to_owned(), "0".to_owned()),
            ("GPU-bbb".to_owned(), "3".to_owned())
        ]
    );
    assert!(parse_time_slices("Successfully set the timeslice of GPU GPU-aaa to 3").is_empty());
}

async fn a_time_slicing_claim_sets_and_restores_the_drivers_time_slice() {
    let node = RealNode::start().await;
    let gpus = node.gpus().await;
    let (device, uuid) = last_gpu(&gpus);
    let before = time_slices(&node.driver);
    assert!(
        before.iter().any(|(u, _)| *u == uuid),
        "the claimed GPU {uuid} is not listed: {before:?}"
    );
    let config = claim_config(
        &["gpu"],
        "GpuConfig",
        json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    );
    let (reference, _spec) = node.prepare("sliced", &device, vec![config]).await;
    let during = time_slices(&node.driver);
    node.unprepare(&reference).await;
    let after = time_slices(&node.driver);
    // `Long` is the driver's time slice 3; only the claimed GPU changes.
    let expected: Vec<(String, String)> = before
        .iter()
        .map(|(u, v)| (u.clone(), if *u == uuid { "3".into() } else { v.clone() }))
        .collect();
    assert_eq!(during, expected, "while the claim is prepared");
    assert_ne!(before, during, "the claimed GPU already had time slice 3");
    assert_eq!(after, before, "unprepare did not restore the time slice");
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // Run under a fake driver binary's name (a hard link in the fake root), act as it.
    if let Some(status) = tessera_fake_driver::tool::main_if_named(&argv) {
        return status;
    }
    if !argv.iter().any(|a| a == "--list") {
        if let Some(reason) = cannot_run() {
            if std::env::var("CI").is_ok_and(|ci| ci == "true") {
                println!("real_gpu: cannot run under CI=true: {reason}");
                return ExitCode::FAILURE;
            }
            println!("real_gpu: skipped: {reason}");
            return ExitCode::SUCCESS;
        }
        let mode = match std::env::var(REAL_DRIVER_ROOT) {
            Ok(root) => format!("the real driver at {root}"),
            Err(_) => format!("a fake driver root ({FAKE_TOPOLOGY})"),
        };
        println!("real_gpu: against {mode}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    harness::run(
        &argv,
        &[
            ("a_claimed_gpu_is_all_a_container_sees", &|| {
                runtime.block_on(a_claimed_gpu_is_all_a_container_sees())
            }),
            (
                "an_mps_claim_runs_the_drivers_daemon_and_its_clients_see_the_limits",
                &|| {
                    runtime.block_on(
                        an_mps_claim_runs_the_drivers_daemon_and_its_clients_see_the_limits(),
                    )
                },
            ),
            (
                "time_slices_are_read_per_gpu",
                &time_slices_are_read_per_gpu,
            ),
            (
                "a_time_slicing_claim_sets_and_restores_the_drivers_time_slice",
                &|| {
                    runtime
                        .block_on(a_time_slicing_claim_sets_and_restores_the_drivers_time_slice())
                },
            ),
        ],
    )
}
