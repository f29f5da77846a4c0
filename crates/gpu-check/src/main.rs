//! `tessera-gpu-check`: prints, as one JSON line on stdout, what this container sees of its GPUs,
//! using only what a CUDA program would use and what it can observe:
//!
//! - `env`: every `NVIDIA_*` and `CUDA_*` variable;
//! - `deviceNodes`: `/dev/nvidia*` and `/dev/nvidia-caps/*`, with type and numbers;
//! - `driverFiles`: the driver files mounted into the container (from `/proc/self/mountinfo`),
//!   with their mount options;
//! - `cuda`: `dlopen("libcuda.so.1")` through the loader's search, `cuDriverGetVersion`, `cuInit`
//!   and each device's name, UUID, memory, compute capability, multiprocessors, PCI bus id and
//!   whether it goes through MPS;
//! - `nvml`: `libnvidia-ml.so.1`'s driver version and GPUs;
//! - `nvidiaSmi`: `nvidia-smi -L` found on `PATH`;
//! - `mps` (when `CUDA_MPS_PIPE_DIRECTORY` is set or `/tmp/nvidia-mps` exists): the pipe
//!   directory, whether the control daemon is there, and its default active thread percentage and
//!   per-device pinned memory limits as `nvidia-cuda-mps-control` reports them.
//! - `imex` (when `TESSERA_IMEX_CHANNEL` is set: the container is in an IMEX domain): the channel
//!   number, whether its device node `/dev/nvidia-caps-imex-channels/channel<n>` is there, and
//!   the node's IMEX daemon's answer to `nvidia-imex-ctl -q` on the domain's configuration
//!   (`/etc/nvidia-imex/config.cfg`).
//!
//! It always exits 0 after printing (a container without GPUs is a valid answer); the report says
//! what failed. It runs the same on a real GPU node. What its image needs: glibc
//! (`ld-linux`, `libc.so.6`), `libgcc_s.so.1`, and `/etc/ld.so.cache` optional (the CDI hook
//! writes one); nothing else: the driver comes from the node.

mod cuda;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    /// The report's format version.
    tessera_gpu_check: u32,
    env: BTreeMap<String, String>,
    device_nodes: Vec<DeviceNode>,
    driver_files: Vec<MountedFile>,
    cuda: cuda::CudaReport,
    nvml: NvmlReport,
    nvidia_smi: SmiReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    mps: Option<MpsReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    imex: Option<ImexReport>,
}

/// What a container of an IMEX domain sees of it.
#[derive(Debug, Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct ImexReport {
    /// `TESSERA_IMEX_CHANNEL`.
    channel: String,
    /// Whether `/dev/nvidia-caps-imex-channels/channel<channel>` exists.
    channel_node: bool,
    /// `nvidia-imex-ctl -q`'s answer (`READY`, `NOT_READY …`, `UNAVAILABLE …`).
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    /// `char`, `block` or `other`.
    kind: &'static str,
    major: u64,
    minor: u64,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct MountedFile {
    path: String,
    options: String,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct NvmlReport {
    loaded: bool,
    driver_version: Option<String>,
    gpus: Vec<NvmlGpu>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct NvmlGpu {
    index: u32,
    uuid: String,
    name: String,
    minor: Option<u32>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct SmiReport {
    path: Option<String>,
    exit_code: Option<i32>,
    lines: Vec<String>,
    error: Option<String>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct MpsReport {
    pipe_directory: String,
    log_directory: Option<String>,
    /// The pipe directory is a mount (injected by the driver's CDI spec).
    pipe_directory_mounted: bool,
    /// The daemon's `control` entry exists in the pipe directory.
    control_present: bool,
    active_thread_percentage: Option<String>,
    /// By CUDA device index, as `get_default_device_pinned_mem_limit` prints it.
    pinned_memory_limits: BTreeMap<String, String>,
    error: Option<String>,
}

fn env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("NVIDIA_") || k.starts_with("CUDA_"))
        .collect()
}

/// `major`/`minor` of a Linux `dev_t` (glibc's encoding).
fn dev_numbers(rdev: u64) -> (u64, u64) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major, minor)
}

fn device_nodes(dev: &Path) -> Vec<DeviceNode> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for dir in [dev.to_path_buf(), dev.join("nvidia-caps")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dir == dev && !name.starts_with("nvidia") {
                continue;
            }
            paths.push(entry.path());
        }
    }
    paths.sort();
    paths
        .into_iter()
        .filter_map(|path| {
            let metadata = std::fs::symlink_metadata(&path).ok()?;
            if metadata.is_dir() {
                return None;
            }
            let kind = if metadata.file_type().is_char_device() {
                "char"
            } else if metadata.file_type().is_block_device() {
                "block"
            } else {
                "other"
            };
            let (major, minor) = dev_numbers(metadata.rdev());
            Some(DeviceNode {
                path: path.to_string_lossy().into_owned(),
                kind,
                major,
                minor,
            })
        })
        .collect()
}

/// Whether a mount point is one of the driver's files.
fn is_driver_file(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    const LIBRARIES: [&str; 10] = [
        "libcuda",
        "libnvidia-",
        "libnvcuvid",
        "libnvoptix",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv1_CM_nvidia",
        "libGLESv2_nvidia",
        "libvdpau_nvidia",
        "libcudadebugger",
    ];
    /// The driver's executables (NVIDIA's container toolkit's list).
    const BINARIES: [&str; 7] = [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
        "nvidia-imex",
        "nvidia-imex-ctl",
    ];
    (name.starts_with("lib")
        && name.contains(".so")
        && LIBRARIES.iter().any(|p| name.starts_with(p)))
        || BINARIES.contains(&name.as_str())
        || path.contains("/firmware/nvidia/")
}

/// Mount points and options from `/proc/self/mountinfo` text.
fn mounts(mountinfo: &str) -> Vec<MountedFile> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let path = unescape(fields.get(4)?);
            Some(MountedFile {
                path,
                options: (*fields.get(5)?).to_owned(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(text: &str) -> String {
    text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn nvml() -> NvmlReport {
    let mut report = NvmlReport::default();
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(nvml) => nvml,
        Err(e) => {
            report.error = Some(format!("libnvidia-ml.so.1: {e}"));
            return report;
        }
    };
    report.loaded = true;
    report.driver_version = nvml.sys_driver_version().ok();
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(e) => {
            report.error = Some(format!("nvmlDeviceGetCount: {e}"));
            return report;
        }
    };
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => report.gpus.push(NvmlGpu {
                index,
                uuid: device.uuid().unwrap_or_default(),
                name: device.name().unwrap_or_default(),
                minor: device.minor_number().ok(),
            }),
            Err(e) => {
                report.error = Some(format!("GPU {index}: {e}"));
                break;
            }
        }
    }
    report
}

/// The first `name` on `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .as_deref()
        .map(std::env::split_paths)?
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn nvidia_smi() -> SmiReport {
    let mut report = SmiReport::default();
    let Some(path) = on_path("nvidia-smi") else {
        report.error = Some("nvidia-smi is not on PATH".into());
        return report;
    };
    report.path = Some(path.to_string_lossy().into_owned());
    match Command::new(&path).arg("-L").stdin(Stdio::null()).output() {
        Ok(output) => {
            report.exit_code = output.status.code();
            report.lines = String::from_utf8_lossy(&output.stdout)
                .lines()
                .map(str::to_owned)
                .collect();
            if !output.status.success() {
                report.error = Some(String::from_utf8_lossy(&output.stderr).trim().to_owned());
            }
        }
        Err(e) => report.error = Some(format!("cannot run {}: {e}", path.display())),
    }
    report
}

/// Sends one command to the MPS control daemon through `nvidia-cuda-mps-control`.
fn mps_query(control: &Path, command: &str) -> Result<String, String> {
    let mut child = Command::new(control)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", control.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = writeln!(stdin, "{command}");
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", control.display()))?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "`{command}`: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn mps(mounted: &[MountedFile], cuda_devices: usize) -> Option<MpsReport> {
    let from_env = std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok();
    let pipe = from_env.clone().unwrap_or_else(|| "/tmp/nvidia-mps".into());
    if from_env.is_none() && !Path::new(&pipe).exists() {
        return None;
    }
    let mut report = MpsReport {
        pipe_directory_mounted: mounted.iter().any(|m| m.path == pipe),
        control_present: Path::new(&pipe).join("control").exists(),
        log_directory: std::env::var("CUDA_MPS_LOG_DIRECTORY").ok(),
        pipe_directory: pipe,
        ..MpsReport::default()
    };
    let Some(control) = on_path("nvidia-cuda-mps-control") else {
        report.error = Some("nvidia-cuda-mps-control is not on PATH".into());
        return Some(report);
    };
    match mps_query(&control, "get_default_active_thread_percentage") {
        Ok(value) => report.active_thread_percentage = Some(value),
        Err(e) => {
            report.error = Some(e);
            return Some(report);
        }
    }
    for device in 0..cuda_devices {
        match mps_query(
            &control,
            &format!("get_default_device_pinned_mem_limit {device}"),
        ) {
            Ok(value) => {
                report
                    .pinned_memory_limits
                    .insert(device.to_string(), value);
            }
            Err(e) => report.error = Some(e),
        }
    }
    Some(report)
}

/// The IMEX channel the container got, and whether the node's daemon answers.
fn imex() -> Option<ImexReport> {
    let channel = std::env::var("TESSERA_IMEX_CHANNEL").ok()?;
    let mut report = ImexReport {
        channel_node: Path::new("/dev/nvidia-caps-imex-channels")
            .join(format!("channel{channel}"))
            .exists(),
        channel,
        ..ImexReport::default()
    };
    let Some(ctl) = on_path("nvidia-imex-ctl") else {
        report.error = Some("nvidia-imex-ctl is not on PATH".into());
        return Some(report);
    };
    match Command::new(&ctl)
        .args(["-q", "-c", "/etc/nvidia-imex/config.cfg"])
        .output()
    {
        Ok(output) => {
            let answer = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            let error = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            report.daemon = (!answer.is_empty()).then_some(answer);
            report.error = (!error.is_empty()).then_some(error);
        }
        Err(e) => report.error = Some(format!("cannot run {}: {e}", ctl.display())),
    }
    Some(report)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("tessera-gpu-check {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    let mounted = mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default());
    let cuda = cuda::check();
    let cuda_devices = cuda.devices.len();
    let report = Report {
        tessera_gpu_check: 1,
        env: env(),
        device_nodes: device_nodes(Path::new("/dev")),
        driver_files: mounted
            .iter()
            .filter(|m| is_driver_file(&m.path))
            .map(|m| MountedFile {
                path: m.path.clone(),
                options: m.options.clone(),
            })
            .collect(),
        cuda,
        nvml: nvml(),
        nvidia_smi: nvidia_smi(),
        mps: mps(&mounted, cuda_devices),
        imex: imex(),
    };
    let line = serde_json::to_string(&report).unwrap_or_else(|e| {
        format!("{{\"tesseraGpuCheck\":1,\"error\":\"cannot encode the report: {e}\"}}")
    });
    println!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_files_are_told_from_other_mounts() {
        for yes in [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/lib64/libnvidia-ml.so.1",
            "/usr/bin/nvidia-smi",
            "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
            "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1",
        ] {
            assert!(is_driver_file(yes), "{yes}");
        }
        for no in [
            "/etc/hosts",
            "/dev/nvidia0",
            "/usr/lib/libc.so.6",
            "/tmp/nvidia-mps",
            "/proc",
        ] {
            assert!(!is_driver_file(no), "{no}");
        }
    }

    #[test]
    fn mountinfo_lines_give_mount_points_and_options() {
        let text = "1089 1075 0:52 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15 ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n\
                    1090 1075 0:52 /x /tmp/with\\040space rw - ext4 /dev/vda rw\n";
        let mounts = mounts(text);
        assert_eq!(
            mounts[0].path,
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
        );
        assert_eq!(mounts[0].options, "ro,nosuid,nodev,relatime");
        assert_eq!(mounts[1].path, "/tmp/with space");
    }

    #[test]
    fn device_nodes_list_nvidia_entries_with_numbers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia0"), b"").unwrap();
        std::fs::write(dir.path().join("null"), b"").unwrap();
        std::fs::create_dir(dir.path().join("nvidia-caps")).unwrap();
        std::fs::write(dir.path().join("nvidia-caps/nvidia-cap3"), b"").unwrap();
        let nodes = device_nodes(dir.path());
        let paths: Vec<&str> = nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths.len(), 2, "{paths:?}");
        assert!(paths[0].ends_with("/nvidia-caps/nvidia-cap3"));
        assert!(paths[1].ends_with("/nvidia0"));
        assert_eq!(nodes[0].kind, "other");
        assert_eq!(dev_numbers(0x103), (1, 3));
        assert_eq!(dev_numbers((195 << 8) | 255), (195, 255));
    }
}
