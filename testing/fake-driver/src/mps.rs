//! Stand-ins for `nvidia-cuda-mps-control` and `nvidia-cuda-mps-server`.
//!
//! `nvidia-cuda-mps-control` behaves like the real one for what Tessera (and an operator) does
//! with it:
//! - `-d` starts the control daemon in the background and returns once it answers; `-f` runs it
//!   in the foreground (what a supervisor runs). It serves the pipe directory
//!   `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`), logs to
//!   `CUDA_MPS_LOG_DIRECTORY/control.log` (default `/var/log/nvidia-mps`), writes its pid to
//!   `<pipe>/nvidia-cuda-mps-control.pid`, and serves the GPUs of its `CUDA_VISIBLE_DEVICES`.
//!   A second daemon on the same pipe directory is refused.
//! - Without `-d`/`-f` it is a client: each line of stdin is a command sent to the daemon, whose
//!   answer is printed; no daemon, or a refused command, exits 1.
//! - Commands: `get_server_list`, `get_default_active_thread_percentage`,
//!   `set_default_active_thread_percentage <0-100>`,
//!   `get_default_device_pinned_mem_limit <device>`,
//!   `set_default_device_pinned_mem_limit <device> <value>[K|M|G|T]` (device = index into the
//!   daemon's `CUDA_VISIBLE_DEVICES`), `quit`.
//! - Output formats as a real H100 node printed them (driver 580): a percentage with one decimal
//!   (`100.0` by default; `set_default_active_thread_percentage 25` prints `25.0`), a pinned
//!   memory limit in the largest whole unit (`1024M` set, `1G` read back; `1025M` stays `1025M`),
//!   `set_default_device_pinned_mem_limit` prints nothing, `get_server_list` prints nothing until
//!   a client has connected, then the server's pid.
//!
//! When a CUDA client (the fake libcuda) attaches, the daemon checks that every device of its
//! `CUDA_VISIBLE_DEVICES` is a GPU or MIG device `libnvidia-ml.so.1` knows (a real MPS server
//! fails to start otherwise) and starts `nvidia-cuda-mps-server` from its own directory, once;
//! `get_server_list` lists it. The server stand-in only waits, and ends when its daemon does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_fake_cuda::mps::{self, Answer};

/// The daemon's pid file in the pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// How long `-d` waits for the daemon to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// What a daemon holds: its settings and clients.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonState {
    /// The daemon's `CUDA_VISIBLE_DEVICES` entries.
    pub devices: Vec<String>,
    pub active_thread_percentage: f64,
    /// Pinned device memory limits in MiB, by device index.
    pub pinned_mem_limits_mib: BTreeMap<usize, u64>,
    /// Pids of attached CUDA clients.
    pub clients: BTreeSet<u32>,
    /// Pid of the running server, if one was started.
    pub server: Option<u32>,
}

/// What a command asks the daemon's process to do besides answering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    None,
    /// Stop the daemon.
    Quit,
    /// A client attached and no server runs: start one (after checking the devices).
    StartServer,
}

impl DaemonState {
    /// A daemon serving `devices`.
    pub fn new(devices: Vec<String>) -> Self {
        DaemonState {
            devices,
            active_thread_percentage: 100.0,
            pinned_mem_limits_mib: BTreeMap::new(),
            clients: BTreeSet::new(),
            server: None,
        }
    }

    fn device_index(&self, text: &str) -> Result<usize, String> {
        let index: usize = text
            .parse()
            .map_err(|_| format!("`{text}` is not a device index"))?;
        if index >= self.devices.len() {
            return Err(format!(
                "device {index} does not exist: this daemon serves {} device(s) (CUDA_VISIBLE_DEVICES={})",
                self.devices.len(),
                self.devices.join(",")
            ));
        }
        Ok(index)
    }

    /// Runs one command line.
    pub fn execute(&mut self, line: &str) -> (Answer, Effect) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ok = |text: String| (Answer { ok: true, text }, Effect::None);
        let refuse = |text: String| {
            (
                Answer {
                    ok: false,
                    text: format!("{text}\n"),
                },
                Effect::None,
            )
        };
        match words.as_slice() {
            ["get_server_list"] => ok(self
                .server
                .map(|pid| format!("{pid}\n"))
                .unwrap_or_default()),
            ["get_default_active_thread_percentage"] => {
                ok(format!("{:.1}\n", self.active_thread_percentage))
            }
            ["set_default_active_thread_percentage", value] => match value.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) && p > 0.0 => {
                    self.active_thread_percentage = p;
                    ok(format!("{p:.1}\n"))
                }
                _ => refuse(format!("`{value}` is not a percentage in (0, 100]")),
            },
            ["get_default_device_pinned_mem_limit", device] => match self.device_index(device) {
                Ok(index) => ok(match self.pinned_mem_limits_mib.get(&index) {
                    Some(mib) => format!("{}\n", limit_text(*mib)),
                    None => "0\n".to_owned(),
                }),
                Err(e) => refuse(e),
            },
            ["set_default_device_pinned_mem_limit", device, value] => {
                match (self.device_index(device), parse_mib(value)) {
                    (Ok(index), Some(mib)) => {
                        self.pinned_mem_limits_mib.insert(index, mib);
                        ok(String::new())
                    }
                    (Err(e), _) => refuse(e),
                    (_, None) => refuse(format!(
                        "`{value}` is not a memory size such as 1024M or 2G"
                    )),
                }
            }
            [command, pid] if *command == mps::CLIENT_ATTACH => match pid.parse::<u32>() {
                Ok(pid) => {
                    self.clients.insert(pid);
                    let effect = if self.server.is_none() {
                        Effect::StartServer
                    } else {
                        Effect::None
                    };
                    (
                        Answer {
                            ok: true,
                            text: format!(
                                "active_thread_percentage={:.1}\n",
                                self.active_thread_percentage
                            ),
                        },
                        effect,
                    )
                }
                Err(_) => refuse(format!("`{pid}` is not a process id")),
            },
            ["quit"] => (
                Answer {
                    ok: true,
                    text: String::new(),
                },
                Effect::Quit,
            ),
            _ => refuse(format!("unknown command `{}`", line.trim())),
        }
    }
}

/// A limit as the real daemon prints it: in the largest unit that divides it (`1G`, `1025M`).
fn limit_text(mib: u64) -> String {
    match mib {
        0 => "0".to_owned(),
        m if m % (1 << 20) == 0 => format!("{}T", m >> 20),
        m if m % (1 << 10) == 0 => format!("{}G", m >> 10),
        m => format!("{m}M"),
    }
}

/// `<n>[K|M|G|T]` (bytes without a unit) in MiB, rounded up.
fn parse_mib(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let bytes = match unit.to_ascii_uppercase().as_str() {
        "" => n,
        "K" => n.checked_mul(1 << 10)?,
        "M" => n.checked_mul(1 << 20)?,
        "G" => n.checked_mul(1 << 30)?,
        "T" => n.checked_mul(1 << 40)?,
        _ => return None,
    };
    Some(bytes.div_ceil(1 << 20))
}

/// Appends a line to `<log dir>/<file>`.
fn log(dir: &Path, file: &str, message: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let line = format!("[{}.{:03}] {message}\n", now.as_secs(), now.subsec_millis());
    let _ = fs::create_dir_all(dir);
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file))
    {
        let _ = f.write_all(line.as_bytes());
    }
}

fn visible_devices_from_env() -> Vec<String> {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Checks that NVML knows every device (by UUID) the daemon serves.
fn check_devices(devices: &[String]) -> Result<(), String> {
    let source = tessera_nvml::NvmlSource::open(None)
        .map_err(|e| format!("the driver does not answer: {e}"))?;
    let inventory = source
        .read_inventory()
        .map_err(|e| format!("reading the GPUs failed: {e}"))?;
    let known: BTreeSet<&str> = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            std::iter::once(g.uuid.as_str()).chain(
                g.mig
                    .iter()
                    .flat_map(|m| m.instances.iter().map(|i| i.uuid.as_str())),
            )
        })
        .collect();
    match devices
        .iter()
        .find(|d| !known.contains(d.as_str()) && d.parse::<usize>().is_err())
    {
        Some(unknown) => Err(format!(
            "CUDA_VISIBLE_DEVICES names `{unknown}`, which is not a GPU or MIG device of this node"
        )),
        None => Ok(()),
    }
}

/// Whether a daemon answers on `pipe`.
fn daemon_answers(pipe: &Path) -> bool {
    mps::request(pipe, "get_server_list").is_ok_and(|a| a.ok)
}

/// Runs the daemon in this process until `quit`.
fn serve(pipe: &Path, log_dir: &Path) -> Result<(), String> {
    let (listener, socket) = listen(pipe)?;
    let pid_file = pipe.join(PID_FILE);
    fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| format!("cannot write {}: {e}", pid_file.display()))?;
    let mut state = DaemonState::new(visible_devices_from_env());
    log(
        log_dir,
        "control.log",
        &format!(
            "Control daemon started (pid {}, CUDA_VISIBLE_DEVICES={})",
            std::process::id(),
            state.devices.join(",")
        ),
    );
    let mut server: Option<Child> = None;
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if stream.read_to_string(&mut line).is_err() {
            continue;
        }
        let line = line.trim().to_owned();
        let (mut answer, effect) = state.execute(&line);
        log(
            log_dir,
            "control.log",
            &format!("{line} -> {}", if answer.ok { "ok" } else { "error" }),
        );
        if effect == Effect::StartServer {
            match start_server_for(&mut state, log_dir) {
                Ok(child) => server = Some(child),
                Err(refused) => answer = refused,
            }
        }
        let _ = stream.write_all(&answer.encode());
        drop(stream);
        if effect == Effect::Quit {
            break;
        }
    }
    if let Some(mut child) = server {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = fs::remove_file(&socket);
    let _ = fs::remove_file(&pid_file);
    log(log_dir, "control.log", "Control daemon quit");
    Ok(())
}

/// Listens on `pipe`'s control socket, and the socket's path: refused while another daemon
/// answers there; a socket left by a dead one is replaced.
fn listen(pipe: &Path) -> Result<(UnixListener, PathBuf), String> {
    fs::create_dir_all(pipe).map_err(|e| format!("cannot create {}: {e}", pipe.display()))?;
    let socket = mps::control_socket(pipe);
    if socket.exists() {
        if daemon_answers(pipe) {
            return Err(format!(
                "An instance of this daemon is already running with pipe directory {}",
                pipe.display()
            ));
        }
        let _ = fs::remove_file(&socket);
    }
    let listener = UnixListener::bind(&socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    Ok((listener, socket))
}

/// Starts the MPS server for the first client, once its devices are checked; when it cannot
/// start, the clients are forgotten and the refusal is the client's answer.
fn start_server_for(state: &mut DaemonState, log_dir: &Path) -> Result<Child, Answer> {
    match check_devices(&state.devices).and_then(|()| start_server(log_dir)) {
        Ok(child) => {
            state.server = Some(child.id());
            log(
                log_dir,
                "control.log",
                &format!("Server started (pid {})", child.id()),
            );
            Ok(child)
        }
        Err(e) => {
            state.clients.clear();
            log(
                log_dir,
                "control.log",
                &format!("Server failed to start: {e}"),
            );
            Err(Answer {
                ok: false,
                text: format!("{e}\n"),
            })
        }
    }
}

/// Starts `nvidia-cuda-mps-server` from this program's directory.
fn start_server(log_dir: &Path) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let server = exe.with_file_name("nvidia-cuda-mps-server");
    Command::new(&server)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env("CUDA_MPS_LOG_DIRECTORY", log_dir)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", server.display()))
}

/// `-d`: starts `-f` in the background (its own process group, no inherited output, so a caller
/// waiting for this command's output is not held by the daemon) and waits until it answers.
fn start_background(pipe: &Path, log_dir: &Path) -> Result<(), String> {
    if daemon_answers(pipe) {
        return Err(format!(
            "An instance of this daemon is already running with pipe directory {}",
            pipe.display()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let arg0 = std::env::args_os().next().unwrap_or_default();
    let mut child = Command::new(exe)
        .arg0(arg0)
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if daemon_answers(pipe) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the daemon exited with {status}; see {}",
                log_dir.join("control.log").display()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the daemon did not answer within {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The client: every stdin line to the daemon, answers to stdout.
fn client(pipe: &Path) -> ExitCode {
    let stdin = std::io::stdin();
    let mut status = ExitCode::SUCCESS;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match mps::request(pipe, &line) {
            Ok(answer) => {
                print!("{}", answer.text);
                if !answer.ok {
                    status = ExitCode::FAILURE;
                }
            }
            Err(e) => {
                eprintln!("Cannot find MPS control daemon process ({e})");
                return ExitCode::FAILURE;
            }
        }
    }
    status
}

/// `nvidia-cuda-mps-control`.
pub fn control_main(args: &[String]) -> ExitCode {
    let pipe = mps::pipe_directory_from_env();
    let log_dir = mps::log_directory_from_env();
    let result = match args {
        [] => return client(&pipe),
        [flag] if flag == "-d" => start_background(&pipe, &log_dir),
        [flag] if flag == "-f" => serve(&pipe, &log_dir),
        [flag] if flag == "-h" || flag == "--help" => {
            println!(
                "nvidia-cuda-mps-control (stand-in of a fake driver root)\n  -d  start the control \
                 daemon in the background\n  -f  run it in the foreground\n  (none) send the \
                 commands on stdin to the daemon"
            );
            return ExitCode::SUCCESS;
        }
        other => Err(format!("unknown arguments {other:?}; see -h")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `nvidia-cuda-mps-server`: started by the daemon; waits, and ends when the daemon does.
pub fn server_main(_args: &[String]) -> ExitCode {
    let log_dir = mps::log_directory_from_env();
    let parent = rustix::process::getppid();
    log(
        &log_dir,
        "server.log",
        &format!("Server started (pid {})", std::process::id()),
    );
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if rustix::process::getppid() != parent {
            log(&log_dir, "server.log", "Control daemon gone; server exits");
            return ExitCode::SUCCESS;
        }
    }
}

/// The pid a daemon wrote in `pipe`, if any.
pub fn daemon_pid(pipe: &Path) -> Option<u32> {
    fs::read_to_string(pipe.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Where a pipe directory's daemon logs when `CUDA_MPS_LOG_DIRECTORY` is `log_dir`.
pub fn control_log(log_dir: &Path) -> PathBuf {
    log_dir.join("control.log")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default active thread percentage: 100 at first, set within 1..=100 and read back.
    fn thread_percentage_is_validated_and_kept(daemon: &mut DaemonState) {
        let (answer, effect) = daemon.execute("get_default_active_thread_percentage");
        assert_eq!((answer.text.as_str(), effect), ("100.0\n", Effect::None));
        assert!(
            daemon
                .execute("set_default_active_thread_percentage 25")
                .0
                .ok
        );
        assert_eq!(
            daemon
                .execute("get_default_active_thread_percentage")
                .0
                .text,
            "25.0\n"
        );
        assert!(
            !daemon
                .execute("set_default_active_thread_percentage 0")
                .0
                .ok
        );
        assert!(
            !daemon
                .execute("set_default_active_thread_percentage 101")
                .0
                .ok
        );
    }

    /// Per-device pinned memory limits: set, read back in the largest whole unit, refused for a
    /// device the daemon does not serve or a value that is not a size.
    fn pinned_memory_limits_are_validated_and_kept(daemon: &mut DaemonState) {
        assert!(
            daemon
                .execute("set_default_device_pinned_mem_limit 1 1025M")
                .0
                .ok
        );
        assert_eq!(
            daemon
                .execute("get_default_device_pinned_mem_limit 1")
                .0
                .text,
            "1025M\n"
        );
        assert_eq!(
            daemon
                .execute("get_default_device_pinned_mem_limit 0")
                .0
                .text,
            "0\n"
        );
        assert!(
            daemon
                .execute("set_default_device_pinned_mem_limit 0 2G")
                .0
                .ok
        );
        assert_eq!(daemon.pinned_mem_limits_mib.get(&0), Some(&2048));
        assert_eq!(
            daemon
                .execute("get_default_device_pinned_mem_limit 0")
                .0
                .text,
            "2G\n"
        );
        assert!(
            daemon
                .execute("set_default_device_pinned_mem_limit 0 1024M")
                .0
                .ok
        );
        assert_eq!(
            daemon
                .execute("get_default_device_pinned_mem_limit 0")
                .0
                .text,
            "1G\n"
        );
        let out_of_range = daemon.execute("set_default_device_pinned_mem_limit 2 1G").0;
        assert!(
            !out_of_range.ok && out_of_range.text.contains("serves 2 device(s)"),
            "{out_of_range:?}"
        );
        assert!(
            !daemon
                .execute("set_default_device_pinned_mem_limit 0 lots")
                .0
                .ok
        );
    }

    #[test]
    fn settings_are_validated_and_kept() {
        let mut daemon = DaemonState::new(vec!["GPU-a".into(), "MIG-b".into()]);
        thread_percentage_is_validated_and_kept(&mut daemon);
        pinned_memory_limits_are_validated_and_kept(&mut daemon);
        assert!(!daemon.execute("frobnicate").0.ok);
        assert_eq!(daemon.execute("quit").1, Effect::Quit);
    }

    #[test]
    fn the_first_client_starts_the_server() {
        let mut daemon = DaemonState::new(vec!["GPU-a".into()]);
        assert_eq!(daemon.execute("get_server_list").0.text, "");
        let attach = format!("{} 42", mps::CLIENT_ATTACH);
        assert_eq!(daemon.execute(&attach).1, Effect::StartServer);
        daemon.server = Some(7);
        assert_eq!(daemon.execute(&attach).1, Effect::None);
        assert_eq!(daemon.execute("get_server_list").0.text, "7\n");
    }

    #[test]
    fn sizes_parse_to_mib() {
        assert_eq!(parse_mib("1024M"), Some(1024));
        assert_eq!(parse_mib("1g"), Some(1024));
        assert_eq!(parse_mib("1"), Some(1));
        assert_eq!(parse_mib("1048577"), Some(2));
        assert_eq!(parse_mib("M"), None);
        assert_eq!(parse_mib("1X"), None);
    }
}
