//! `tessera-kubelet-plugin` with a driver root — a fake one (testing/fake-driver), laid out like a
//! real install — as a process against the API-server fake and the kubelet simulator:
//!
//! - a prepared claim's CDI spec injects the driver's libraries under every name, its binaries
//!   and firmware, the loader-cache hook, and the device nodes from the device root; the spec is
//!   one the runtime accepts;
//! - time-slicing runs the driver root's own `nvidia-smi`, which keeps the setting where the
//!   fake driver keeps it, and unprepare puts it back;
//! - MPS starts the driver root's `nvidia-cuda-mps-control -d` with the claim's settings; the
//!   daemon outlives a SIGKILL of the plugin, the restarted plugin finds it again (same process,
//!   same settings) and unprepare stops it;
//! - with `--mps-daemons=pod` the daemon runs in a pod of its own (here a stand-in kubelet runs
//!   the pod's `tessera-mps-daemon` as the pod asks): it outlives the plugin, is found again, goes
//!   with its claim, and a daemon pod of a claim no record knows is deleted at start.
//!
//! This executable also plays the fake driver root's binaries (`nvidia-smi`, the MPS control
//! daemon): run under their names it acts as them. So it has its own `main`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{Value, json};
use support::process::*;
use tessera_fake_apiserver::FakeApiServer;
use tessera_fake_driver::layout::{self, Artifacts, Layout, NodeKind};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_kubelet_grpc::ClaimRef;
use tessera_prepare_harness::{allocated_claim, claim_config};
use tessera_test_support::harness;

const TOPOLOGY: &str = "dgx-h100";

/// A fake driver root and device root for the plugin's node.
struct FakeDriver {
    _dir: tempfile::TempDir,
    root: PathBuf,
    dev_root: PathBuf,
    hook: PathBuf,
    inventory: GpuInventory,
}

impl FakeDriver {
    fn new() -> FakeDriver {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver");
        let dev_root = dir.path().join("dev-root");
        let inventory = MockSource::new(TOPOLOGY)
            .unwrap()
            .for_node(NODE)
            .inventory()
            .unwrap();
        layout::write_dev_root(&dev_root, &inventory, NodeKind::RegularFile).unwrap();
        let artifacts = Artifacts::of_test_executable().unwrap();
        layout::write_driver_root(&root, Layout::Host, NODE, &inventory, &dev_root, &artifacts)
            .unwrap();
        // The hook as the chart installs it; these tests read specs, they do not run containers.
        let hook = dir.path().join("tessera-cdi-hook");
        std::fs::write(&hook, b"").unwrap();
        FakeDriver {
            root,
            dev_root,
            hook,
            inventory,
            _dir: dir,
        }
    }

    fn flags(&self) -> Vec<String> {
        vec![
            "--topology".into(),
            TOPOLOGY.into(),
            "--driver-root".into(),
            self.root.display().to_string(),
            "--dev-root".into(),
            self.dev_root.display().to_string(),
            "--cdi-hook-path".into(),
            self.hook.display().to_string(),
        ]
    }

    fn lib_dir(&self) -> PathBuf {
        self.root.join("usr/lib").join(layout::multiarch_triplet())
    }

    /// `nvidia-smi <args>` of the driver root, as the node plugin runs it.
    fn nvidia_smi(&self, args: &[&str]) -> String {
        let output = Command::new(self.root.join("usr/bin/nvidia-smi"))
            .args(args)
            .env("LD_LIBRARY_PATH", self.lib_dir())
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    }

    fn gpu(&self, device: &str) -> &tessera_gpu_inventory::Gpu {
        let minor: u32 = device.trim_start_matches("gpu-").parse().unwrap();
        self.inventory
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .unwrap()
    }
}

/// Asks the driver root's MPS control client `command` about the daemon on `pipe`: its output,
/// or `None` when no daemon answers.
fn mps_ask(fake: &FakeDriver, pipe: &Path, command: &str) -> Option<String> {
    use std::io::Write;
    let mut child = Command::new(fake.root.join("usr/bin/nvidia-cuda-mps-control"))
        .env("LD_LIBRARY_PATH", fake.lib_dir())
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", pipe.with_file_name("log"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{command}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    output
        .status
        .success()
        .then(|| String::from_utf8(output.stdout).unwrap())
}

/// Stops a daemon the test left running (a failed assertion before unprepare).
struct QuitOnDrop<'a>(&'a FakeDriver, PathBuf);

impl Drop for QuitOnDrop<'_> {
    fn drop(&mut self) {
        if tessera_fake_driver::mps::daemon_pid(&self.1).is_some() {
            let _ = mps_ask(self.0, &self.1, "quit");
        }
    }
}

/// A stand-in kubelet for MPS daemon pods: runs the `tessera-mps-daemon` of each pod in
/// `namespace` as a process (the pod's driver-root volume is the fake root), and sends SIGTERM to
/// the process of a pod that is gone. Stops (and stops its daemons) when dropped.
struct PodRunner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const MPS_NAMESPACE: &str = "tessera-system";

impl PodRunner {
    fn start(server: FakeApiServer, driver_root: PathBuf) -> PodRunner {
        use k8s_openapi::api::core::v1::Pod;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut running: std::collections::BTreeMap<String, std::process::Child> =
                Default::default();
            let terminate = |child: &mut std::process::Child| {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while child.try_wait().ok().flatten().is_none() {
                    if std::time::Instant::now() > deadline {
                        let _ = child.kill();
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            };
            while !stopping.load(Ordering::SeqCst) {
                let pods: Vec<Pod> = server.list(Some(MPS_NAMESPACE));
                let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
                for pod in &pods {
                    let name = pod.name_any();
                    if running.contains_key(&name) || pod.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let container = &pod.spec.as_ref().unwrap().containers[0];
                    let in_root = |arg: &String| {
                        arg.split(':')
                            .map(|part| match part.strip_prefix("/driver-root/") {
                                Some(rest) => driver_root.join(rest).display().to_string(),
                                None => part.to_owned(),
                            })
                            .collect::<Vec<_>>()
                            .join(":")
                    };
                    let mut command = Command::new(env!("CARGO_BIN_EXE_tessera-mps-daemon"));
                    command.args(container.args.iter().flatten().map(in_root));
                    for var in container.env.iter().flatten() {
                        command.env(&var.name, var.value.as_deref().unwrap_or_default());
                    }
                    running.insert(name, command.spawn().unwrap());
                }
                let gone: Vec<String> = running
                    .keys()
                    .filter(|name| !names.contains(name))
                    .cloned()
                    .collect();
                for name in gone {
                    terminate(running.get_mut(&name).unwrap());
                    running.remove(&name);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            for child in running.values_mut() {
                terminate(child);
            }
        });
        PodRunner {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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

fn mount_to<'a>(spec: &'a Value, container_path: &str) -> &'a Value {
    spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["containerPath"] == container_path)
        .unwrap_or_else(|| panic!("no mount to {container_path} in {spec:#}"))
}

/// The spec mounts the driver's libraries under every name, its binaries and firmware, read-only,
/// and runs the loader-cache hook with them (`lib`: the multiarch library directory).
fn assert_driver_files_and_hook(spec: &Value, fake: &FakeDriver, lib: &str) {
    let cuda = mount_to(spec, &format!("{lib}/libcuda.so.1"));
    assert_eq!(
        cuda["hostPath"],
        fake.root
            .join(&lib[1..])
            .join("libcuda.so.550.54.15")
            .display()
            .to_string()
            .as_str()
    );
    assert_eq!(
        cuda["options"],
        json!(["ro", "nosuid", "nodev", "rbind", "rprivate"])
    );
    mount_to(spec, &format!("{lib}/libcuda.so.550.54.15"));
    mount_to(spec, &format!("{lib}/libcuda.so"));
    mount_to(spec, &format!("{lib}/libnvidia-ml.so.1"));
    mount_to(spec, &format!("{lib}/vdpau/libvdpau_nvidia.so.1"));
    let smi = mount_to(spec, "/usr/bin/nvidia-smi");
    assert_eq!(
        smi["hostPath"],
        fake.root
            .join("usr/bin/nvidia-smi")
            .display()
            .to_string()
            .as_str()
    );
    mount_to(spec, "/usr/bin/nvidia-cuda-mps-control");
    mount_to(spec, "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin");

    let hook = &spec["containerEdits"]["hooks"][0];
    assert_eq!(hook["hookName"], "createContainer");
    assert_eq!(hook["path"], fake.hook.display().to_string().as_str());
    let args: Vec<&str> = hook["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&args[..2], ["tessera-cdi-hook", "update-ldcache"]);
    assert!(
        args.contains(&format!("libcuda.so.1={lib}/libcuda.so.1").as_str()),
        "{args:?}"
    );
}

async fn the_spec_injects_the_drivers_files_and_device_nodes() {
    let fake = FakeDriver::new();
    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let flags = fake.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;

    let claim = server.seed(&allocated_claim("one", &[("gpu", "gpu-3")], Vec::new()));
    let reference = ClaimRef::new("ml", "one", claim.uid().unwrap());
    let prepared = kubelet
        .prepare(std::slice::from_ref(&reference))
        .await
        .unwrap();
    assert!(
        prepared[&reference.uid].is_ok(),
        "{prepared:?}\n{}",
        plugin_logs(&dirs)
    );

    let spec = spec_of(&dirs);
    let parsed: tessera_cdi::Spec = serde_json::from_value(spec.clone()).unwrap();
    parsed.validate().unwrap();
    let lib = format!("/usr/lib/{}", layout::multiarch_triplet());
    assert_driver_files_and_hook(&spec, &fake, &lib);

    let control: Vec<(&str, &str)> = spec["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["path"].as_str().unwrap(), n["hostPath"].as_str().unwrap()))
        .collect();
    let under = |p: &str| fake.dev_root.join(&p[1..]).display().to_string();
    assert_eq!(
        control,
        vec![
            ("/dev/nvidiactl", under("/dev/nvidiactl").as_str()),
            ("/dev/nvidia-uvm", under("/dev/nvidia-uvm").as_str()),
            (
                "/dev/nvidia-uvm-tools",
                under("/dev/nvidia-uvm-tools").as_str()
            ),
        ]
    );
    let gpu = fake.gpu("gpu-3");
    let node = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(node["path"], format!("/dev/nvidia{}", gpu.minor).as_str());
    assert_eq!(
        node["hostPath"],
        under(&format!("/dev/nvidia{}", gpu.minor)).as_str()
    );
    // CUDA enumerates the injected node (the fake driver's GPU); no variable narrows it.
    assert!(spec["devices"][0]["containerEdits"]["env"].is_null());
    assert!(
        spec["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .contains(&json!("NVIDIA_VISIBLE_DEVICES=void"))
    );

    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&reference))
        .await
        .unwrap();
    assert!(unprepared[&reference.uid].is_ok());
    assert_eq!(std::fs::read_dir(dirs.path("cdi")).unwrap().count(), 0);
}

async fn time_slicing_runs_the_drivers_nvidia_smi() {
    let fake = FakeDriver::new();
    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let flags = fake.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;

    let gpu = fake.gpu("gpu-5").uuid.clone();
    let listed = || fake.nvidia_smi(&["compute-policy", "-l", "-i", &gpu]);
    assert!(listed().ends_with("timeslice 0\n"));
    let claim = server.seed(&allocated_claim(
        "shared",
        &[("gpu", "gpu-5")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
        )],
    ));
    let reference = ClaimRef::new("ml", "shared", claim.uid().unwrap());
    let prepared = kubelet
        .prepare(std::slice::from_ref(&reference))
        .await
        .unwrap();
    assert!(
        prepared[&reference.uid].is_ok(),
        "{prepared:?}\n{}",
        plugin_logs(&dirs)
    );
    assert!(listed().ends_with("timeslice 3\n"), "{}", listed());
    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&reference))
        .await
        .unwrap();
    assert!(unprepared[&reference.uid].is_ok());
    assert!(listed().ends_with("timeslice 0\n"), "{}", listed());
}

/// Whether process `pid` runs (a zombie waiting for a reaper counts as stopped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(") ")
            .is_some_and(|(_, s)| s.starts_with('Z'))
    })
}

/// The MPS daemon behind `pipe` serves the claim's GPU `gpu`, and the spec points the containers
/// at its pipe.
fn assert_daemon_serves_the_claim(fake: &FakeDriver, dirs: &PluginDirs, pipe: &Path, gpu: &str) {
    let log = std::fs::read_to_string(tessera_fake_driver::mps::control_log(
        &pipe.with_file_name("log"),
    ))
    .unwrap();
    assert!(log.contains(&fake.gpu(gpu).uuid), "{log}");
    assert!(
        spec_of(dirs)
            .to_string()
            .contains(&pipe.display().to_string()),
        "{:#}",
        spec_of(dirs)
    );
}

async fn an_mps_daemon_outlives_a_plugin_kill_and_stops_on_unprepare() {
    let fake = FakeDriver::new();
    let (server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let flags = fake.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;

    let claim = server.seed(&allocated_claim(
        "mps",
        &[("gpu", "gpu-2")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}),
        )],
    ));
    let reference = ClaimRef::new("ml", "mps", claim.uid().unwrap());
    let claims = std::slice::from_ref(&reference);
    let prepared = kubelet.prepare(claims).await.unwrap();
    assert!(
        prepared[&reference.uid].is_ok(),
        "{prepared:?}\n{}",
        plugin_logs(&dirs)
    );
    let pipe = dirs
        .path("state")
        .join("mps")
        .join(reference.uid.to_string())
        .join("pipe");
    let _cleanup = QuitOnDrop(&fake, pipe.clone());
    let pid = tessera_fake_driver::mps::daemon_pid(&pipe)
        .unwrap_or_else(|| panic!("no daemon in {}\n{}", pipe.display(), plugin_logs(&dirs)));
    assert_eq!(
        mps_ask(&fake, &pipe, "get_default_active_thread_percentage").as_deref(),
        Some("25.0\n")
    );
    assert_daemon_serves_the_claim(&fake, &dirs, &pipe, "gpu-2");

    plugin.kill();
    drop(kubelet);
    assert!(alive(pid), "the daemon died with the plugin");
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;
    // The kubelet prepares again after a restart: the same daemon, with its settings.
    let again = kubelet.prepare(claims).await.unwrap();
    assert_eq!(again, prepared, "{}", plugin_logs(&dirs));
    assert_eq!(tessera_fake_driver::mps::daemon_pid(&pipe), Some(pid));
    assert_eq!(
        mps_ask(&fake, &pipe, "get_default_active_thread_percentage").as_deref(),
        Some("25.0\n")
    );

    let unprepared = kubelet.unprepare(claims).await.unwrap();
    assert!(
        unprepared[&reference.uid].is_ok(),
        "{unprepared:?}\n{}",
        plugin_logs(&dirs)
    );
    eventually(
        &dirs,
        "the daemon to stop",
        Duration::from_secs(10),
        async || (!alive(pid)).then_some(()),
    )
    .await;
    assert_eq!(mps_ask(&fake, &pipe, "get_server_list"), None);
    drop(plugin);
}

/// The daemon behind `pipe` runs with the claim's settings: 40% of the threads, 1Gi pinned.
fn assert_claims_mps_settings(fake: &FakeDriver, pipe: &Path) {
    assert_eq!(
        mps_ask(fake, pipe, "get_default_active_thread_percentage").as_deref(),
        Some("40.0\n")
    );
    assert_eq!(
        mps_ask(fake, pipe, "get_default_device_pinned_mem_limit 0").as_deref(),
        Some("1G\n")
    );
}

/// The plugin's flags for the fake driver, with MPS daemons run in pods.
fn pod_daemon_flags(fake: &FakeDriver) -> Vec<String> {
    let mut flags = fake.flags();
    flags.extend(
        [
            "--mps-daemons",
            "pod",
            "--mps-daemon-image",
            "tessera:test",
            "--namespace",
            MPS_NAMESPACE,
        ]
        .map(String::from),
    );
    flags
}

/// A copy of the daemon pod `pod` for a claim no record knows ("orphan"), with its pipe and log
/// directories made under the plugin's state: the pod, and the orphan's MPS directory.
fn orphan_daemon_pod(pod: &Pod, dirs: &PluginDirs) -> (Pod, PathBuf) {
    let mut orphan = pod.clone();
    orphan.metadata = kube::api::ObjectMeta {
        name: Some("tessera-mps-orphan".into()),
        namespace: Some(MPS_NAMESPACE.into()),
        labels: pod.metadata.labels.clone().map(|mut labels| {
            labels.insert("gpu.tessera.dev/mps-claim".into(), "orphan".into());
            labels
        }),
        ..Default::default()
    };
    let orphan_dir = dirs.path("state").join("mps").join("orphan");
    for sub in ["pipe", "log"] {
        std::fs::create_dir_all(orphan_dir.join(sub)).unwrap();
    }
    let orphan_env = orphan.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap();
    orphan_env[1].value = Some(orphan_dir.join("pipe").display().to_string());
    orphan_env[2].value = Some(orphan_dir.join("log").display().to_string());
    (orphan, orphan_dir)
}

/// Waits until the orphan daemon pod is deleted and its daemon has stopped.
async fn wait_for_the_orphan_to_go(
    server: &FakeApiServer,
    dirs: &PluginDirs,
    fake: &FakeDriver,
    orphan_dir: &Path,
) {
    eventually(
        dirs,
        "the orphan pod to go",
        Duration::from_secs(20),
        async || {
            server
                .get::<Pod>(Some(MPS_NAMESPACE), "tessera-mps-orphan")
                .is_none()
                .then_some(())
        },
    )
    .await;
    eventually(
        dirs,
        "the orphan's daemon to stop",
        Duration::from_secs(20),
        async || {
            mps_ask(fake, &orphan_dir.join("pipe"), "get_server_list")
                .is_none()
                .then_some(())
        },
    )
    .await;
}

async fn an_mps_daemon_pod_outlives_the_plugin_and_goes_with_its_claim() {
    let fake = FakeDriver::new();
    let (server, http, _) = api_server_with_node().await;
    server.seed_json(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MPS_NAMESPACE}
    }));
    let _kubelet_pods = PodRunner::start(server.clone(), fake.root.clone());
    let dirs = PluginDirs::new();
    let flags = pod_daemon_flags(&fake);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;

    let claim = server.seed(&allocated_claim(
        "mps",
        &[("gpu", "gpu-4")],
        vec![claim_config(
            &["gpu"],
            "GpuConfig",
            json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 40,
                   "defaultPinnedDeviceMemoryLimit": "1Gi"}}),
        )],
    ));
    let uid = claim.uid().unwrap();
    let reference = ClaimRef::new("ml", "mps", uid.clone());
    let claims = std::slice::from_ref(&reference);
    let prepared = kubelet.prepare(claims).await.unwrap();
    assert!(
        prepared[&reference.uid].is_ok(),
        "{prepared:?}\n{}",
        plugin_logs(&dirs)
    );
    let pod_name = format!("tessera-mps-{uid}");
    let pod: Pod = server
        .get(Some(MPS_NAMESPACE), &pod_name)
        .expect("the claim's daemon pod");
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let pipe = dirs.path("state").join("mps").join(&uid).join("pipe");
    let _cleanup = QuitOnDrop(&fake, pipe.clone());
    let pid = tessera_fake_driver::mps::daemon_pid(&pipe).expect("the pod's daemon answers");
    assert_claims_mps_settings(&fake, &pipe);

    // A daemon pod of a claim no record knows (its claim was unprepared while the plugin was
    // down) is deleted when the plugin starts again.
    let (orphan, orphan_dir) = orphan_daemon_pod(&pod, &dirs);
    plugin.kill();
    drop(kubelet);
    server.seed(&orphan);
    let _orphan_cleanup = QuitOnDrop(&fake, orphan_dir.join("pipe"));
    eventually(
        &dirs,
        "the orphan's daemon",
        Duration::from_secs(20),
        async || tessera_fake_driver::mps::daemon_pid(&orphan_dir.join("pipe")),
    )
    .await;

    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let kubelet = register(&dirs).await;
    let again = kubelet.prepare(claims).await.unwrap();
    assert_eq!(again, prepared, "{}", plugin_logs(&dirs));
    assert_eq!(tessera_fake_driver::mps::daemon_pid(&pipe), Some(pid));
    wait_for_the_orphan_to_go(&server, &dirs, &fake, &orphan_dir).await;
    assert!(mps_ask(&fake, &pipe, "get_server_list").is_some());

    let unprepared = kubelet.unprepare(claims).await.unwrap();
    assert!(
        unprepared[&reference.uid].is_ok(),
        "{unprepared:?}\n{}",
        plugin_logs(&dirs)
    );
    assert!(server.get::<Pod>(Some(MPS_NAMESPACE), &pod_name).is_none());
    assert_eq!(mps_ask(&fake, &pipe, "get_server_list"), None);
    drop(plugin);
}

/// Starts the plugin with `flags` while `fake`'s root holds no driver, waits until it says why
/// (`reason` each in its log), checks it keeps waiting, then lays the driver and waits until it
/// registers.
async fn waits_with_the_reason_until_the_driver_is_laid(
    fake: &FakeDriver,
    flags: &[String],
    reason: &[String],
) {
    // The GPU operator's driver container has not laid its files yet.
    let laid = fake.root.with_extension("laid");
    std::fs::rename(&fake.root, &laid).unwrap();
    std::fs::create_dir(&fake.root).unwrap();
    let (_server, http, _) = api_server_with_node().await;
    let dirs = PluginDirs::new();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let plugin = PluginProcess::start(http.kubeconfig_path(), &dirs, &flags, &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let logs = plugin_logs(&dirs);
        if logs.contains("waiting for a complete NVIDIA driver") {
            for part in reason {
                assert!(logs.contains(part.as_str()), "{part}: {logs}");
            }
            break;
        }
        assert!(
            plugin.child.lock().unwrap().try_wait().unwrap().is_none(),
            "the plugin stopped instead of waiting: {logs}"
        );
        assert!(std::time::Instant::now() < deadline, "{logs}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        plugin.child.lock().unwrap().try_wait().unwrap().is_none(),
        "the plugin must wait, not stop"
    );
    // Alive (the liveness probe leaves it be), not ready, and /readyz says why.
    let alive = eventually(
        &dirs,
        "/healthz while waiting",
        Duration::from_secs(10),
        async || plugin.http_get("/healthz").await,
    )
    .await;
    assert_eq!(alive.0, 200, "{alive:?}");
    let (code, body) = plugin.http_get("/readyz").await.unwrap();
    assert_eq!(code, 503, "{body}");
    for part in reason {
        assert!(body.contains(part.as_str()), "{part}: {body}");
    }
    // The driver arrives: the plugin starts and registers with the kubelet.
    std::fs::remove_dir(&fake.root).unwrap();
    std::fs::rename(&laid, &fake.root).unwrap();
    let _kubelet = register(&dirs).await;
    assert!(
        plugin_logs(&dirs).contains("NVIDIA driver found"),
        "{}",
        plugin_logs(&dirs)
    );
    // The plugin's own endpoints took the port over.
    let ready = eventually(
        &dirs,
        "/readyz ready",
        Duration::from_secs(30),
        async || {
            plugin
                .http_get("/readyz")
                .await
                .filter(|(code, _)| *code == 200)
        },
    )
    .await;
    assert_eq!(ready.0, 200);
    let (_, metrics) = plugin.http_get("/metrics").await.unwrap();
    assert!(metrics.contains("tessera_node_"), "{metrics}");
}

async fn a_root_without_a_driver_waits_with_the_reason_and_starts_once_it_is_there() {
    let fake = FakeDriver::new();
    let root = fake.root.display().to_string();
    let reason = [format!(
        "no NVIDIA driver under the driver root: {root} is empty"
    )];
    waits_with_the_reason_until_the_driver_is_laid(&fake, &fake.flags(), &reason).await;
}

/// The chart's default shape: the GPU operator's root first (here never made: no operator),
/// then the host's. The wait names both and what each lacks; the host's is used once complete.
async fn candidate_roots_wait_naming_each_and_start_on_the_first_complete() {
    let fake = FakeDriver::new();
    let operator = fake.root.with_file_name("run-nvidia").join("driver");
    let mut flags = fake.flags();
    let at = flags.iter().position(|f| f == "--driver-root").unwrap();
    flags.splice(
        at..at,
        ["--driver-root".to_owned(), operator.display().to_string()],
    );
    let reason = [
        "no NVIDIA driver under any candidate driver root".to_owned(),
        format!("{} does not exist", operator.display()),
        format!("{} is empty", fake.root.display()),
    ];
    waits_with_the_reason_until_the_driver_is_laid(&fake, &flags, &reason).await;
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // Run under a fake driver binary's name (a hard link in the fake root), act as it.
    if let Some(status) = tessera_fake_driver::tool::main_if_named(&argv) {
        return status;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    harness::run(
        &argv,
        &[
            (
                "the_spec_injects_the_drivers_files_and_device_nodes",
                &|| runtime.block_on(the_spec_injects_the_drivers_files_and_device_nodes()),
            ),
            ("time_slicing_runs_the_drivers_nvidia_smi", &|| {
                runtime.block_on(time_slicing_runs_the_drivers_nvidia_smi())
            }),
            (
                "an_mps_daemon_outlives_a_plugin_kill_and_stops_on_unprepare",
                &|| runtime.block_on(an_mps_daemon_outlives_a_plugin_kill_and_stops_on_unprepare()),
            ),
            (
                "an_mps_daemon_pod_outlives_the_plugin_and_goes_with_its_claim",
                &|| {
                    runtime
                        .block_on(an_mps_daemon_pod_outlives_the_plugin_and_goes_with_its_claim())
                },
            ),
            (
                "candidate_roots_wait_naming_each_and_start_on_the_first_complete",
                &|| {
                    runtime.block_on(
                        candidate_roots_wait_naming_each_and_start_on_the_first_complete(),
                    )
                },
            ),
            (
                "a_root_without_a_driver_waits_with_the_reason_and_starts_once_it_is_there",
                &|| {
                    runtime.block_on(
                        a_root_without_a_driver_waits_with_the_reason_and_starts_once_it_is_there(),
                    )
                },
            ),
        ],
    )
}
