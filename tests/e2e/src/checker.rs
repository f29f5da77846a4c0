//! The in-container checker's report (crates/gpu-check, `tessera-gpu-check`): the one JSON line a
//! container of the workload image prints, and what it must say for a container with a claim
//! and for one without (pure; the scenarios read the line from the pod's log).
//!
//! Only the fields the assertions need are read; the crate's README documents the whole schema.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use serde::Deserialize;

/// The marker key the checker's line starts with.
const MARKER: &str = "\"tesseraGpuCheck\"";

/// Device nodes every claim container gets besides its GPUs'.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckerReport {
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub device_nodes: Vec<CheckerDeviceNode>,
    #[serde(default)]
    pub driver_files: Vec<DriverFile>,
    pub cuda: Cuda,
    pub nvidia_smi: NvidiaSmi,
    #[serde(default)]
    pub mps: Option<Mps>,
    #[serde(default)]
    pub imex: Option<Imex>,
}

/// The checker's `imex` section: the container's IMEX channel and its node's daemon.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Imex {
    pub channel: String,
    pub channel_node: bool,
    #[serde(default)]
    pub daemon: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CheckerDeviceNode {
    pub path: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DriverFile {
    pub path: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cuda {
    pub loaded: bool,
    #[serde(default)]
    pub init: Option<String>,
    #[serde(default)]
    pub devices: Vec<CheckerCudaDevice>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckerCudaDevice {
    pub uuid: String,
    #[serde(default)]
    pub mps_enabled: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvidiaSmi {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mps {
    #[serde(default)]
    pub pipe_directory_mounted: bool,
    #[serde(default)]
    pub control_present: bool,
    #[serde(default)]
    pub active_thread_percentage: Option<String>,
    #[serde(default)]
    pub pinned_memory_limits: BTreeMap<String, String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// The checker's report in a container's log: `None` when the log has no checker line yet.
pub fn find_report(log: &str) -> Option<anyhow::Result<CheckerReport>> {
    let line = log
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with('{') && line.contains(MARKER))?;
    Some(serde_json::from_str(line).with_context(|| {
        format!("the checker's line is not the report crates/gpu-check documents: {line}")
    }))
}

/// How many checker reports a container's log holds, and the last one (a container that runs
/// the checker again and again, objects::CHECK_EVERY_2S); `None` when there is none yet.
pub fn last_report(log: &str) -> Option<(usize, anyhow::Result<CheckerReport>)> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with('{') && line.contains(MARKER))
        .collect();
    let last = lines.last()?;
    Some((
        lines.len(),
        serde_json::from_str(last).with_context(|| {
            format!("the checker's line is not the report crates/gpu-check documents: {last}")
        }),
    ))
}

/// What a claim container must see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// The claim's GPUs' device minors (`/dev/nvidia<minor>`), MIG devices' parents included.
    pub gpu_minors: BTreeSet<i64>,
    /// How many MIG devices: each brings two `/dev/nvidia-caps/` nodes.
    pub mig_devices: usize,
    /// The UUIDs CUDA must list (`MIG-…` for MIG devices).
    pub uuids: BTreeSet<String>,
    /// MPS settings when the claim shares its GPU through MPS.
    pub mps: Option<ExpectedMps>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedMps {
    pub active_thread_percentage: Option<u32>,
    pub pinned_memory_bytes: Option<u128>,
}

fn is_gpu_node(path: &str) -> bool {
    path.strip_prefix("/dev/nvidia")
        .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()))
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Checks the report of a container that uses a claim.
pub fn check_claim_container(report: &CheckerReport, expected: &Expected) -> anyhow::Result<()> {
    check_device_nodes(report, expected)?;
    check_driver_files(report)?;
    check_cuda(report, expected)?;
    ensure!(
        report.nvidia_smi.exit_code == Some(0),
        "nvidia-smi -L in the container: exit code {:?}, error {:?}",
        report.nvidia_smi.exit_code,
        report.nvidia_smi.error
    );
    if let Some(want) = &expected.mps {
        check_mps(report, want)?;
    }
    Ok(())
}

/// The claim's GPU device nodes exactly, the control nodes, and two `/dev/nvidia-caps/` nodes
/// per MIG device.
fn check_device_nodes(report: &CheckerReport, expected: &Expected) -> anyhow::Result<()> {
    let paths: BTreeSet<&str> = report
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    let gpus: BTreeSet<String> = paths
        .iter()
        .filter(|p| is_gpu_node(p))
        .map(|p| p.to_string())
        .collect();
    let want: BTreeSet<String> = expected
        .gpu_minors
        .iter()
        .map(|m| format!("/dev/nvidia{m}"))
        .collect();
    ensure!(
        gpus == want,
        "GPU device nodes {gpus:?}, expected exactly the claim's {want:?}"
    );
    for control in CONTROL_NODES {
        ensure!(
            paths.contains(control),
            "control node {control} missing (device nodes: {paths:?})"
        );
    }
    let caps = paths
        .iter()
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .count();
    ensure!(
        caps == 2 * expected.mig_devices,
        "{caps} /dev/nvidia-caps nodes, expected {} for {} MIG device(s) (device nodes: {paths:?})",
        2 * expected.mig_devices,
        expected.mig_devices
    );
    Ok(())
}

/// The driver root's libcuda, libnvidia-ml and nvidia-smi mounted in the container.
fn check_driver_files(report: &CheckerReport) -> anyhow::Result<()> {
    let files: Vec<&str> = report
        .driver_files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    for (what, found) in [
        (
            "libcuda.so.*",
            files.iter().any(|f| basename(f).starts_with("libcuda.so")),
        ),
        (
            "libnvidia-ml.so.*",
            files
                .iter()
                .any(|f| basename(f).starts_with("libnvidia-ml.so")),
        ),
        (
            "nvidia-smi",
            files.iter().any(|f| basename(f) == "nvidia-smi"),
        ),
    ] {
        ensure!(
            found,
            "the driver root's {what} is not mounted in the container (driver files: {files:?})"
        );
    }
    Ok(())
}

/// libcuda loaded and initialised, listing exactly the claim's devices.
fn check_cuda(report: &CheckerReport, expected: &Expected) -> anyhow::Result<()> {
    ensure!(
        report.cuda.loaded && report.cuda.init.as_deref() == Some("CUDA_SUCCESS"),
        "libcuda.so.1 did not load and initialise: loaded {}, cuInit {:?}, error {:?}",
        report.cuda.loaded,
        report.cuda.init,
        report.cuda.error
    );
    let cuda: BTreeSet<&str> = report
        .cuda
        .devices
        .iter()
        .map(|d| d.uuid.as_str())
        .collect();
    let want_uuids: BTreeSet<&str> = expected.uuids.iter().map(String::as_str).collect();
    ensure!(
        cuda == want_uuids,
        "CUDA lists devices {cuda:?}, expected the claim's {want_uuids:?}"
    );
    Ok(())
}

fn check_mps(report: &CheckerReport, want: &ExpectedMps) -> anyhow::Result<()> {
    let mps = report
        .mps
        .as_ref()
        .context("the claim uses MPS, but the checker saw no MPS pipe directory")?;
    ensure!(
        mps.pipe_directory_mounted && mps.control_present,
        "MPS pipe directory mounted {}, control daemon's socket present {} (error {:?})",
        mps.pipe_directory_mounted,
        mps.control_present,
        mps.error
    );
    if let Some(percentage) = want.active_thread_percentage {
        let seen = mps.active_thread_percentage.as_deref().unwrap_or("");
        ensure!(
            seen.parse::<f64>().ok() == Some(f64::from(percentage)),
            "MPS default active thread percentage `{seen}`, expected {percentage} (error {:?})",
            mps.error
        );
    }
    if let Some(bytes) = want.pinned_memory_bytes {
        ensure!(
            !mps.pinned_memory_limits.is_empty(),
            "MPS reports no pinned memory limits, expected {bytes} bytes per device (error {:?})",
            mps.error
        );
        for (device, limit) in &mps.pinned_memory_limits {
            ensure!(
                parse_mps_size(limit) == Some(bytes),
                "MPS pinned memory limit of device {device} is `{limit}`, expected {bytes} bytes"
            );
        }
    }
    for device in &report.cuda.devices {
        ensure!(
            device.mps_enabled == Some(true),
            "CUDA device {} does not report MPS enabled ({:?})",
            device.uuid,
            device.mps_enabled
        );
    }
    Ok(())
}

/// An MPS size as nvidia-cuda-mps-control prints it: a number with an optional binary suffix
/// (`K`, `M`, `G`, `T`), bytes without one.
pub fn parse_mps_size(text: &str) -> Option<u128> {
    let text = text.trim();
    let (number, shift) = match text.chars().last()? {
        'K' | 'k' => (&text[..text.len() - 1], 10),
        'M' | 'm' => (&text[..text.len() - 1], 20),
        'G' | 'g' => (&text[..text.len() - 1], 30),
        'T' | 't' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    number.parse::<u128>().ok().map(|n| n << shift)
}

/// Checks the report of a container without a claim: it sees nothing of the driver.
pub fn check_unclaimed_container(report: &CheckerReport) -> anyhow::Result<()> {
    let nodes: Vec<&str> = report
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    ensure!(
        nodes.is_empty(),
        "a container without a claim sees device nodes {nodes:?}"
    );
    let files: Vec<&str> = report
        .driver_files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    ensure!(
        files.is_empty(),
        "a container without a claim has driver files {files:?}"
    );
    ensure!(
        !report.cuda.loaded,
        "a container without a claim loaded libcuda.so.1"
    );
    ensure!(
        report.nvidia_smi.exit_code.is_none() && report.nvidia_smi.path.is_none(),
        "a container without a claim ran nvidia-smi ({:?}, exit code {:?})",
        report.nvidia_smi.path,
        report.nvidia_smi.exit_code
    );
    let gpu_env: Vec<&String> = report
        .env
        .keys()
        .filter(|k| k.as_str() == "NVIDIA_VISIBLE_DEVICES" || k.as_str() == "CUDA_VISIBLE_DEVICES")
        .collect();
    ensure!(
        gpu_env.is_empty(),
        "a container without a claim has {gpu_env:?} set"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIMED: &str = r#"{"tesseraGpuCheck":1,"env":{"CUDA_VISIBLE_DEVICES":"GPU-a"},"deviceNodes":[{"path":"/dev/nvidia-uvm","kind":"char","major":1,"minor":3},{"path":"/dev/nvidia-uvm-tools","kind":"char","major":1,"minor":3},{"path":"/dev/nvidia3","kind":"char","major":1,"minor":3},{"path":"/dev/nvidiactl","kind":"char","major":1,"minor":3}],"driverFiles":[{"path":"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15","options":"ro"},{"path":"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15","options":"ro"},{"path":"/usr/bin/nvidia-smi","options":"ro"}],"cuda":{"loaded":true,"path":"/x","driverVersion":12040,"init":"CUDA_SUCCESS","devices":[{"index":0,"uuid":"GPU-a","mpsEnabled":false}],"error":null},"nvml":{"loaded":true},"nvidiaSmi":{"path":"/usr/bin/nvidia-smi","exitCode":0,"lines":["GPU 0"],"error":null}}"#;

    const BARE: &str = r#"{"tesseraGpuCheck":1,"env":{},"deviceNodes":[],"driverFiles":[],"cuda":{"loaded":false,"path":null,"init":null,"devices":[],"error":"libcuda.so.1: cannot open"},"nvml":{"loaded":false},"nvidiaSmi":{"path":null,"exitCode":null,"lines":[],"error":"not on PATH"}}"#;

    fn expected() -> Expected {
        Expected {
            gpu_minors: [3].into(),
            mig_devices: 0,
            uuids: ["GPU-a".to_owned()].into(),
            mps: None,
        }
    }

    fn report(text: &str) -> CheckerReport {
        find_report(&format!("NVIDIA_VISIBLE_DEVICES=GPU-a\n{text}\n"))
            .expect("a checker line")
            .expect("a valid report")
    }

    #[test]
    fn a_claim_container_with_its_gpu_passes() {
        check_claim_container(&report(CLAIMED), &expected()).unwrap();
    }

    #[test]
    fn another_gpu_or_a_missing_library_fails() {
        let mut other = expected();
        other.gpu_minors = [2].into();
        let error = check_claim_container(&report(CLAIMED), &other).unwrap_err();
        assert!(error.to_string().contains("/dev/nvidia3"), "{error}");

        let without_cuda = CLAIMED.replace("libcuda.so.550.54.15", "libfoo.so");
        let error = check_claim_container(&report(&without_cuda), &expected()).unwrap_err();
        assert!(error.to_string().contains("libcuda"), "{error}");

        let mut more = expected();
        more.uuids.insert("GPU-b".to_owned());
        assert!(check_claim_container(&report(CLAIMED), &more).is_err());
    }

    #[test]
    fn mps_needs_the_daemon_and_its_limits() {
        let mut want = expected();
        want.mps = Some(ExpectedMps {
            active_thread_percentage: Some(50),
            pinned_memory_bytes: Some(10 << 30),
        });
        assert!(check_claim_container(&report(CLAIMED), &want).is_err());
        let with_mps = CLAIMED
            .replace("\"mpsEnabled\":false", "\"mpsEnabled\":true")
            .replace(
                "\"nvml\"",
                r#""mps":{"pipeDirectory":"/tmp/nvidia-mps","pipeDirectoryMounted":true,"controlPresent":true,"activeThreadPercentage":"50.0","pinnedMemoryLimits":{"0":"10240M"},"error":null},"nvml""#,
            );
        check_claim_container(&report(&with_mps), &want).unwrap();
        let half = with_mps.replace("10240M", "5G");
        assert!(check_claim_container(&report(&half), &want).is_err());
    }

    #[test]
    fn an_unclaimed_container_sees_nothing() {
        check_unclaimed_container(&report(BARE)).unwrap();
        assert!(check_unclaimed_container(&report(CLAIMED)).is_err());
    }

    #[test]
    fn the_last_of_repeated_reports_is_read() {
        assert!(last_report("CUDA_VISIBLE_DEVICES=GPU-a\n").is_none());
        let later = CLAIMED.replace("\"exitCode\":0", "\"exitCode\":7");
        let log = format!("{BARE}\nCUDA_VISIBLE_DEVICES=GPU-a\n{CLAIMED}\n{later}\n");
        let (count, last) = last_report(&log).unwrap();
        assert_eq!(count, 3);
        assert_eq!(last.unwrap().nvidia_smi.exit_code, Some(7));
        let (count, last) = last_report(&format!("{CLAIMED}\n{{\"tesseraGpuCheck\":1}}")).unwrap();
        assert_eq!(count, 2);
        assert!(last.is_err());
    }

    #[test]
    fn logs_without_a_report_and_sizes() {
        assert!(find_report("CUDA_VISIBLE_DEVICES=GPU-a\n").is_none());
        assert!(find_report("{\"tesseraGpuCheck\":1}").unwrap().is_err());
        assert_eq!(parse_mps_size("10240M"), Some(10 << 30));
        assert_eq!(parse_mps_size("10G"), Some(10 << 30));
        assert_eq!(parse_mps_size("0"), Some(0));
        assert_eq!(parse_mps_size("x"), None);
    }
}
