//! The real [`GpuControl`]: NVIDIA's command-line tools.
//!
//! - Time slice: `nvidia-smi compute-policy -i <uuid> --set-timeslice=<0..3>` (NVML does not
//!   expose the setting).
//! - MPS: one control daemon per claim, `nvidia-cuda-mps-control -d` with
//!   `CUDA_VISIBLE_DEVICES` = the claim's MPS devices and the claim's own
//!   `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY`. `-d` returns once the daemon listens.
//!   Settings go through the control interface (commands on the client's stdin):
//!   `set_default_active_thread_percentage <pct>` and
//!   `set_default_device_pinned_mem_limit <device index> <MiB>M`. Whether a daemon is running
//!   is asked the same way (`get_server_list` fails when no daemon answers); `quit` stops it.
//!   The control client returns as soon as `quit` is sent, while the daemon shuts its server down
//!   and exits after (a real H100 logs "Server N exited" then), so stopping waits until the
//!   daemon no longer answers: removing its directory before that races with its last writes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tessera_api::config::TimeSliceInterval;

use super::{GpuControl, MpsDaemon, MpsDirectories, SharingError};

/// NVIDIA's tools, found on `PATH` unless configured (the plugin configures the driver root's).
#[derive(Debug, Clone)]
pub struct SystemGpuControl {
    nvidia_smi: PathBuf,
    mps_control: PathBuf,
    /// Set for every tool run (`LD_LIBRARY_PATH` of a driver root that is not on the loader's
    /// path).
    env: BTreeMap<String, String>,
    /// How long a daemon may keep answering after `quit` before stopping it is an error.
    stop_wait: Duration,
}

/// The default for [`SystemGpuControl::stop_wait`]: well inside the kubelet's 45 s call deadline.
const STOP_WAIT: Duration = Duration::from_secs(10);
const STOP_POLL: Duration = Duration::from_millis(50);

impl Default for SystemGpuControl {
    fn default() -> Self {
        Self {
            nvidia_smi: PathBuf::from("nvidia-smi"),
            mps_control: PathBuf::from("nvidia-cuda-mps-control"),
            env: BTreeMap::new(),
            stop_wait: STOP_WAIT,
        }
    }
}

/// A finished command that did not succeed, or did not start.
fn run(
    program: &Path,
    args: &[&str],
    base_env: &BTreeMap<String, String>,
    env: &BTreeMap<&str, String>,
    stdin: Option<&str>,
) -> Result<(), String> {
    let describe = || format!("`{} {}`", program.display(), args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .envs(base_env)
        .envs(env)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", describe()))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| format!("cannot write to {}: {e}", describe()))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("cannot wait for {}: {e}", describe()))?;
    if output.status.success() {
        return Ok(());
    }
    let mut message = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if message.is_empty() {
        message = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    }
    Err(format!(
        "{} exited with {}: {message}",
        describe(),
        output.status
    ))
}

impl SystemGpuControl {
    /// The tools at these paths (for nodes where they are not on `PATH`, and for tests).
    pub fn with_programs(nvidia_smi: impl Into<PathBuf>, mps_control: impl Into<PathBuf>) -> Self {
        Self {
            nvidia_smi: nvidia_smi.into(),
            mps_control: mps_control.into(),
            env: BTreeMap::new(),
            stop_wait: STOP_WAIT,
        }
    }

    /// Runs the tools with `LD_LIBRARY_PATH=<library_path>` (the driver root's library
    /// directories, which are not on this process's loader path unless the root is `/`).
    pub fn with_library_path(mut self, library_path: impl Into<String>) -> Self {
        self.env
            .insert("LD_LIBRARY_PATH".to_owned(), library_path.into());
        self
    }

    fn mps_env(directories: &MpsDirectories) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            (
                "CUDA_MPS_PIPE_DIRECTORY",
                directories.pipe.to_string_lossy().into_owned(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY",
                directories.log.to_string_lossy().into_owned(),
            ),
        ])
    }

    /// Sends one command to the daemon behind `directories`.
    fn mps_command(&self, directories: &MpsDirectories, command: &str) -> Result<(), String> {
        run(
            &self.mps_control,
            &[],
            &self.env,
            &Self::mps_env(directories),
            Some(&format!("{command}\n")),
        )
    }

    /// Whether a daemon answers in `directories` (`get_server_list` through the control client).
    pub fn daemon_answers(&self, directories: &MpsDirectories) -> bool {
        directories.pipe.is_dir() && self.mps_command(directories, "get_server_list").is_ok()
    }

    /// Applies `daemon`'s settings (active thread percentage, pinned memory limits) to the daemon
    /// that answers in its directories, through the control client.
    pub fn configure(&self, daemon: &MpsDaemon) -> Result<(), String> {
        if let Some(pct) = daemon.active_thread_percentage {
            self.mps_command(
                &daemon.directories,
                &format!("set_default_active_thread_percentage {pct}"),
            )?;
        }
        for (index, device) in daemon.devices.iter().enumerate() {
            if let Some(bytes) = device.pinned_memory_limit_bytes {
                let mib = bytes.div_ceil(1 << 20);
                self.mps_command(
                    &daemon.directories,
                    &format!("set_default_device_pinned_mem_limit {index} {mib}M"),
                )?;
            }
        }
        Ok(())
    }
}

impl GpuControl for SystemGpuControl {
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), SharingError> {
        let value = format!("--set-timeslice={}", interval.nvidia_smi_value());
        run(
            &self.nvidia_smi,
            &["compute-policy", "-i", gpu_uuid, &value],
            &self.env,
            &BTreeMap::new(),
            None,
        )
        .map_err(|reason| SharingError::TimeSlice {
            gpu: gpu_uuid.to_owned(),
            interval,
            reason,
        })
    }

    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError> {
        let failed = |reason: String| SharingError::StartMps {
            claim_uid: daemon.claim_uid.clone(),
            pipe: daemon.directories.pipe.clone(),
            reason,
        };
        for dir in [&daemon.directories.pipe, &daemon.directories.log] {
            std::fs::create_dir_all(dir)
                .map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
        }
        if !self.daemon_answers(&daemon.directories) {
            let mut env = Self::mps_env(&daemon.directories);
            let uuids: Vec<&str> = daemon.devices.iter().map(|d| d.uuid.as_str()).collect();
            env.insert("CUDA_VISIBLE_DEVICES", uuids.join(","));
            run(&self.mps_control, &["-d"], &self.env, &env, None).map_err(failed)?;
        }
        self.configure(daemon).map_err(failed)
    }

    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError> {
        if !self.daemon_answers(directories) {
            return Ok(());
        }
        let failed = |reason: String| SharingError::StopMps {
            pipe: directories.pipe.clone(),
            reason,
        };
        self.mps_command(directories, "quit").map_err(failed)?;
        let deadline = Instant::now() + self.stop_wait;
        while self.daemon_answers(directories) {
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "the daemon still answers {:?} after `quit`; stop it by hand \
                     (`echo quit | nvidia-cuda-mps-control` with CUDA_MPS_PIPE_DIRECTORY={}) \
                     and unprepare is retried",
                    self.stop_wait,
                    directories.pipe.display()
                )));
            }
            std::thread::sleep(STOP_POLL);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::sharing::MpsDevice;

    /// A stand-in for an NVIDIA tool: logs its arguments, MPS environment and stdin, and plays
    /// an MPS daemon whose liveness is a file in the pipe directory.
    fn fake_tool(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        let log = dir.join("calls.log");
        fs::write(
            &path,
            format!(
                r#"#!/bin/sh
input=""
if [ ! -t 0 ]; then input=$(cat); fi
echo "{name} $* | visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY | $input" >> {log}
case "$*|$input" in
  "-d|") touch "$CUDA_MPS_PIPE_DIRECTORY/running" ;;
  "|get_server_list") [ -e "$CUDA_MPS_PIPE_DIRECTORY/running" ] || exit 1 ;;
  "|quit") rm -f "$CUDA_MPS_PIPE_DIRECTORY/running" ;;
  "compute-policy -i GPU-bad"*) echo "GPU not found" >&2; exit 3 ;;
esac
"#,
                log = log.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn calls(dir: &Path) -> Vec<String> {
        fs::read_to_string(dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn time_slices_go_through_nvidia_smi() {
        let dir = tempfile::tempdir().unwrap();
        let control = SystemGpuControl::with_programs(
            fake_tool(dir.path(), "nvidia-smi"),
            fake_tool(dir.path(), "mps"),
        );
        control
            .set_time_slice("GPU-1", TimeSliceInterval::Long)
            .unwrap();
        assert_eq!(
            calls(dir.path()),
            vec!["nvidia-smi compute-policy -i GPU-1 --set-timeslice=3 | visible= pipe= | "]
        );
        let err = control
            .set_time_slice("GPU-bad", TimeSliceInterval::Short)
            .unwrap_err()
            .to_string();
        assert!(err.contains("GPU not found"), "{err}");
        assert!(err.contains("GPU-bad"), "{err}");
    }

    #[test]
    fn one_daemon_per_claim_started_configured_and_stopped_idempotently() {
        let dir = tempfile::tempdir().unwrap();
        let control = SystemGpuControl::with_programs(
            fake_tool(dir.path(), "nvidia-smi"),
            fake_tool(dir.path(), "mps"),
        );
        let pipe = dir.path().join("claim/pipe");
        let daemon = MpsDaemon {
            claim_uid: "uid".into(),
            directories: MpsDirectories {
                pipe: pipe.clone(),
                log: dir.path().join("claim/log"),
            },
            devices: vec![
                MpsDevice {
                    uuid: "GPU-1".into(),
                    pinned_memory_limit_bytes: None,
                },
                MpsDevice {
                    uuid: "MIG-2".into(),
                    pinned_memory_limit_bytes: Some((1 << 30) + 1),
                },
            ],
            active_thread_percentage: Some(25),
        };
        control.start_mps(&daemon).unwrap();
        let p = pipe.display();
        assert_eq!(
            calls(dir.path()),
            vec![
                format!("mps  | visible= pipe={p} | get_server_list"),
                format!("mps -d | visible=GPU-1,MIG-2 pipe={p} | "),
                format!("mps  | visible= pipe={p} | set_default_active_thread_percentage 25"),
                format!("mps  | visible= pipe={p} | set_default_device_pinned_mem_limit 1 1025M"),
            ]
        );
        assert!(daemon.directories.log.is_dir());

        // Starting again only reconfigures the running daemon.
        fs::remove_file(dir.path().join("calls.log")).unwrap();
        control.start_mps(&daemon).unwrap();
        assert!(!calls(dir.path()).iter().any(|c| c.starts_with("mps -d")));

        control.stop_mps(&daemon.directories).unwrap();
        assert!(!pipe.join("running").exists());
        fs::remove_file(dir.path().join("calls.log")).unwrap();
        control.stop_mps(&daemon.directories).unwrap();
        assert_eq!(
            calls(dir.path()),
            vec![format!("mps  | visible= pipe={p} | get_server_list")],
            "no quit for a daemon that is not running"
        );
    }

    /// An MPS control client whose daemon exits `exit_after` after `quit` (never, if `None`), as
    /// NVIDIA's does: the client returns at once, the daemon goes a moment later.
    fn slow_quitting_tool(dir: &Path, exit_after: Option<&str>) -> PathBuf {
        let path = dir.join("mps");
        let quit = match exit_after {
            Some(delay) => format!(
                r#"(sleep {delay}; rm -f "$CUDA_MPS_PIPE_DIRECTORY/running") >/dev/null 2>&1 &"#
            ),
            None => ":".to_owned(),
        };
        fs::write(
            &path,
            format!(
                r#"#!/bin/sh
input=$(cat)
case "$input" in
  get_server_list) [ -e "$CUDA_MPS_PIPE_DIRECTORY/running" ] || exit 1 ;;
  quit) {quit} ;;
esac
"#
            ),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn running_daemon(dir: &Path) -> MpsDirectories {
        let directories = MpsDirectories {
            pipe: dir.join("pipe"),
            log: dir.join("log"),
        };
        fs::create_dir_all(&directories.pipe).unwrap();
        fs::write(directories.pipe.join("running"), b"").unwrap();
        directories
    }

    #[test]
    fn stopping_returns_once_the_daemon_has_gone_not_when_quit_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let control = SystemGpuControl::with_programs(
            "/nonexistent/nvidia-smi",
            slow_quitting_tool(dir.path(), Some("0.3")),
        );
        let directories = running_daemon(dir.path());
        control.stop_mps(&directories).unwrap();
        assert!(
            !directories.pipe.join("running").exists(),
            "stop_mps returned while the daemon still answered"
        );
    }

    #[test]
    fn a_daemon_that_ignores_quit_is_an_error_naming_its_pipe_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut control = SystemGpuControl::with_programs(
            "/nonexistent/nvidia-smi",
            slow_quitting_tool(dir.path(), None),
        );
        control.stop_wait = Duration::from_millis(200);
        let directories = running_daemon(dir.path());
        let err = control.stop_mps(&directories).unwrap_err().to_string();
        assert!(err.contains("still answers"), "{err}");
        assert!(
            err.contains(&directories.pipe.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn a_missing_tool_is_a_clear_error() {
        let control =
            SystemGpuControl::with_programs("/nonexistent/nvidia-smi", "/nonexistent/mps");
        let err = control
            .set_time_slice("GPU-1", TimeSliceInterval::Default)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot run `/nonexistent/nvidia-smi"), "{err}");
    }
}
