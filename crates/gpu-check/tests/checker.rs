//! The checker against a fake driver root, the way a container would run it: the root's library
//! directory on the loader's path, its binaries on `PATH`, only the claimed GPUs' device nodes
//! under the device root, and the claim's environment.
//!
//! This executable is also the fake root's stand-in binaries (run under their names it acts as
//! them), so the checker test needs nothing cargo does not build for it.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use serde_json::Value;
use tessera_fake_driver::layout::{self, Artifacts, Layout, NodeKind};
use tessera_gpu_inventory::{DeviceSource, GpuInventory, MockSource};
use tessera_test_support::{harness, needed_libraries, running_as_root};

const CHECKER: &str = env!("CARGO_BIN_EXE_tessera-gpu-check");
const NODE: &str = "checker-node";

struct FakeNode {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    lib: PathBuf,
    bin: PathBuf,
    inventory: GpuInventory,
}

impl FakeNode {
    /// A fake root whose device root keeps only the device nodes of GPUs `keep` (NVML indices).
    fn new(topology: &str, keep: &[usize]) -> FakeNode {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver");
        let dev_root = dir.path().join("dev-root");
        let inventory = MockSource::new(topology)
            .unwrap()
            .for_node(NODE)
            .inventory()
            .unwrap();
        layout::write_dev_root(&dev_root, &inventory, NodeKind::RegularFile).unwrap();
        for (i, gpu) in inventory.gpus.iter().enumerate() {
            if !keep.contains(&i) {
                std::fs::remove_file(dev_root.join(format!("dev/nvidia{}", gpu.minor))).unwrap();
            }
        }
        let artifacts = Artifacts::of_test_executable().unwrap();
        let summary =
            layout::write_driver_root(&root, Layout::Host, NODE, &inventory, &dev_root, &artifacts)
                .unwrap();
        FakeNode {
            lib: root.join(summary.library_dir.strip_prefix("/").unwrap()),
            bin: root.join(summary.binary_dir.strip_prefix("/").unwrap()),
            dir: dir.path().to_path_buf(),
            _dir: dir,
            inventory,
        }
    }

    fn command(&self, program: &Path, env: &[(&str, String)]) -> Command {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("LD_LIBRARY_PATH", &self.lib)
            .env("PATH", format!("{}:/usr/bin:/bin", self.bin.display()))
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .stdin(Stdio::null());
        command
    }

    fn check(&self, env: &[(&str, String)]) -> Value {
        let output = self.command(Path::new(CHECKER), env).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
        serde_json::from_str(&stdout).unwrap()
    }
}

fn strings(value: &Value, pointer: &str, field: &str) -> Vec<String> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{pointer} in {value}"))
        .iter()
        .map(|v| v[field].as_str().unwrap().to_owned())
        .collect()
}

fn a_claimed_gpu_is_the_only_one_cuda_nvml_and_nvidia_smi_see() {
    let node = FakeNode::new("dgx-h100", &[3]);
    let gpu = &node.inventory.gpus[3];
    let report = node.check(&[
        ("NVIDIA_VISIBLE_DEVICES", gpu.uuid.clone()),
        ("CUDA_VISIBLE_DEVICES", gpu.uuid.clone()),
    ]);
    assert_eq!(report["tesseraGpuCheck"], 1);
    assert_eq!(report["env"]["NVIDIA_VISIBLE_DEVICES"], gpu.uuid.as_str());
    assert_eq!(report["cuda"]["loaded"], true, "{report}");
    assert!(
        report["cuda"]["path"]
            .as_str()
            .unwrap()
            .ends_with("libcuda.so.550.54.15")
    );
    assert_eq!(report["cuda"]["init"], "CUDA_SUCCESS");
    assert_eq!(report["cuda"]["driverVersion"], 12040);
    assert_eq!(
        strings(&report, "/cuda/devices", "uuid"),
        vec![gpu.uuid.clone()]
    );
    let device = &report["cuda"]["devices"][0];
    assert_eq!(device["name"], gpu.product_name.as_str());
    // CUDA reports the memory less the driver's reserve, as a real H100 does (480 MiB).
    assert_eq!(device["memoryBytes"], gpu.memory_bytes - (480 << 20));
    assert_eq!(device["computeCapability"], "9.0");
    assert_eq!(device["mpsEnabled"], false);
    assert_eq!(
        strings(&report, "/nvml/gpus", "uuid"),
        vec![gpu.uuid.clone()]
    );
    assert_eq!(
        report["nvml"]["driverVersion"],
        node.inventory.driver_version.as_str()
    );
    assert_eq!(report["nvidiaSmi"]["exitCode"], 0);
    let lines = report["nvidiaSmi"]["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].as_str().unwrap().contains(&gpu.uuid));
    assert!(report.get("mps").is_none());
}

fn cuda_visible_devices_selects_among_the_gpus_a_container_has() {
    let node = FakeNode::new("dgx-h100", &[1, 2, 5]);
    let g = |i: usize| node.inventory.gpus[i].uuid.clone();
    let report = node.check(&[("CUDA_VISIBLE_DEVICES", format!("{},{}", g(5), g(1)))]);
    assert_eq!(strings(&report, "/cuda/devices", "uuid"), vec![g(5), g(1)]);
    assert_eq!(
        strings(&report, "/nvml/gpus", "uuid"),
        vec![g(1), g(2), g(5)]
    );
    let all = node.check(&[]);
    assert_eq!(
        strings(&all, "/cuda/devices", "uuid"),
        vec![g(1), g(2), g(5)]
    );
}

fn a_mig_device_is_named_by_its_mig_uuid() {
    let node = FakeNode::new("hgx-a100-mig", &[1]);
    let gpu = &node.inventory.gpus[1];
    let mig = &gpu.mig.as_ref().unwrap().instances[1];
    let report = node.check(&[("CUDA_VISIBLE_DEVICES", mig.uuid.clone())]);
    assert_eq!(
        strings(&report, "/cuda/devices", "uuid"),
        vec![mig.uuid.clone()]
    );
    assert_eq!(
        report["cuda"]["devices"][0]["name"],
        format!("{} MIG {}", gpu.product_name, mig.profile).as_str()
    );
    assert_eq!(
        report["cuda"]["devices"][0]["memoryBytes"],
        mig.memory_bytes
    );
}

fn without_a_driver_nothing_is_found_and_the_report_says_so() {
    let output = Command::new(CHECKER)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(output.status.success());
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["cuda"]["loaded"], false);
    assert!(
        report["cuda"]["error"]
            .as_str()
            .unwrap()
            .contains("libcuda.so.1")
    );
    assert_eq!(report["nvml"]["loaded"], false);
    assert_eq!(report["nvidiaSmi"]["error"], "nvidia-smi is not on PATH");
    assert_eq!(report["env"], serde_json::json!({}));
}

fn mps_clients_see_the_daemon_and_its_limits() {
    let node = FakeNode::new("dgx-h100", &[0, 6]);
    let g = |i: usize| node.inventory.gpus[i].uuid.clone();
    let pipe = node.dir.join("mps/pipe");
    let log = node.dir.join("mps/log");
    let mps_env = vec![
        ("CUDA_MPS_PIPE_DIRECTORY", pipe.display().to_string()),
        ("CUDA_MPS_LOG_DIRECTORY", log.display().to_string()),
    ];
    let control = node.bin.join("nvidia-cuda-mps-control");
    let mut daemon_env = mps_env.clone();
    daemon_env.push(("CUDA_VISIBLE_DEVICES", format!("{},{}", g(0), g(6))));
    let started = node
        .command(&control, &daemon_env)
        .arg("-d")
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    // Whatever happens below, the daemon stops (quit, or a kill from its pid file).
    struct Stop(PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(pid) = tessera_fake_driver::mps::daemon_pid(&self.0) {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
    let _stop = Stop(pipe.clone());
    let configure = |commands: &str| {
        let mut child = node
            .command(&control, &mps_env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(commands.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let set = configure(
        "set_default_active_thread_percentage 25\nset_default_device_pinned_mem_limit 1 1025M\n",
    );
    let mut env = mps_env.clone();
    env.push(("CUDA_VISIBLE_DEVICES", format!("{},{}", g(0), g(6))));
    let report = node.check(&env);
    let quit = configure("quit\n");
    assert!(
        set.status.success() && quit.status.success(),
        "{set:?} {quit:?}"
    );

    let mps = &report["mps"];
    assert_eq!(mps["pipeDirectory"], pipe.display().to_string().as_str());
    assert_eq!(mps["controlPresent"], true, "{report}");
    assert_eq!(mps["activeThreadPercentage"], "25.0");
    assert_eq!(
        mps["pinnedMemoryLimits"],
        serde_json::json!({"0": "0", "1": "1025M"})
    );
    assert_eq!(report["cuda"]["devices"][0]["mpsEnabled"], true);
    let control_log = std::fs::read_to_string(log.join("control.log")).unwrap();
    assert!(
        control_log.contains("Server started"),
        "the client started a server: {control_log}"
    );
}

fn copy_into(rootfs: &Path, host: &Path, at: &str) {
    let target = rootfs.join(at.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::copy(host, &target).unwrap();
}

/// The real loader in a root filesystem like a container's (GKE-style: the driver in
/// /usr/local/nvidia/lib64, which no distribution's loader searches): libcuda.so.1 is found only
/// once the CDI hook has written its loader cache entries.
fn the_loader_finds_the_driver_through_the_hooks_cache() {
    if !running_as_root() {
        println!("(skipped: chroot needs root; CI runs as root)");
        return;
    }
    let node = FakeNode::new("dgx-h100", &[]);
    let gpu = &node.inventory.gpus[2];
    let rootfs = node.dir.join("rootfs");
    copy_into(&rootfs, Path::new(CHECKER), "/usr/bin/tessera-gpu-check");
    let mut libraries = vec![];
    for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let at = format!("/usr/local/nvidia/lib64/{name}");
        copy_into(&rootfs, &node.lib.join(name), &at);
        libraries.push(tessera_driver_root::ldcache::Entry::native(name, at));
    }
    for binary in [
        Path::new(CHECKER),
        &node.lib.join("libcuda.so.1"),
        &node.lib.join("libnvidia-ml.so.1"),
    ] {
        for library in needed_libraries(binary) {
            copy_into(&rootfs, &library, &library.display().to_string());
        }
    }
    std::fs::create_dir_all(rootfs.join("dev")).unwrap();
    std::fs::write(rootfs.join(format!("dev/nvidia{}", gpu.minor)), b"").unwrap();
    let run = || {
        let chroot = ["/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("chroot (coreutils)");
        let output = Command::new(chroot)
            .arg(&rootfs)
            .arg("/usr/bin/tessera-gpu-check")
            .env_clear()
            .env("PATH", "/usr/bin")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let before = run();
    assert_eq!(before["cuda"]["loaded"], false, "{before}");
    tessera_driver_root::hook::update_ldcache(&rootfs, libraries).unwrap();
    let after = run();
    assert_eq!(after["cuda"]["loaded"], true, "{after}");
    // (No /proc in this bare chroot, so the checker cannot tell which file it mapped.)
    assert_eq!(after["cuda"]["path"], Value::Null);
    assert_eq!(
        strings(&after, "/cuda/devices", "uuid"),
        vec![gpu.uuid.clone()]
    );
    assert_eq!(after["nvml"]["loaded"], true);
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    // Run under a fake driver binary's name (a hard link in the fake root), act as it.
    if let Some(status) = tessera_fake_driver::tool::main_if_named(&argv) {
        return status;
    }
    harness::run(
        &argv,
        &[
            (
                "a_claimed_gpu_is_the_only_one_cuda_nvml_and_nvidia_smi_see",
                &a_claimed_gpu_is_the_only_one_cuda_nvml_and_nvidia_smi_see,
            ),
            (
                "cuda_visible_devices_selects_among_the_gpus_a_container_has",
                &cuda_visible_devices_selects_among_the_gpus_a_container_has,
            ),
            (
                "a_mig_device_is_named_by_its_mig_uuid",
                &a_mig_device_is_named_by_its_mig_uuid,
            ),
            (
                "without_a_driver_nothing_is_found_and_the_report_says_so",
                &without_a_driver_nothing_is_found_and_the_report_says_so,
            ),
            (
                "mps_clients_see_the_daemon_and_its_limits",
                &mps_clients_see_the_daemon_and_its_limits,
            ),
            (
                "the_loader_finds_the_driver_through_the_hooks_cache",
                &the_loader_finds_the_driver_through_the_hooks_cache,
            ),
        ],
    )
}
