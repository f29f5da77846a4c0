//! `tessera-mps-daemon`: runs one claim's MPS control daemon in the foreground and keeps its
//! settings, as the main process of the claim's MPS pod (`--mps-daemons=pod`, see
//! `tessera_node::mps_pods`).
//!
//! It starts the driver's `nvidia-cuda-mps-control -f` (the claim's `CUDA_VISIBLE_DEVICES`,
//! `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY` come through its environment), waits
//! until the daemon answers, applies the claim's settings through the control interface
//! (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`) and then waits
//! for the daemon. Every (re)start of the pod's container applies the settings again. On SIGTERM
//! (the plugin deleted the pod: the claim was unprepared) it asks the daemon to `quit` and waits
//! for it; if the daemon exits by itself, so does this program, with its status: the kubelet
//! restarts the container after a crash (`restartPolicy: OnFailure`), not after a `quit`.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

/// Runs an MPS control daemon in the foreground with its settings.
#[derive(Debug, Parser)]
#[command(name = "tessera-mps-daemon", version, max_term_width = 100)]
struct Args {
    /// The driver's nvidia-cuda-mps-control.
    #[arg(long)]
    control: PathBuf,
    /// The driver's library directories (LD_LIBRARY_PATH of the daemon and of its client).
    #[arg(long, default_value = "")]
    library_path: String,
    /// set_default_active_thread_percentage.
    #[arg(long)]
    active_thread_percentage: Option<u8>,
    /// set_default_device_pinned_mem_limit, as `<device index>=<limit>` (e.g. `1=1024M`);
    /// repeated.
    #[arg(long = "pinned-mem-limit")]
    pinned_mem_limits: Vec<String>,
    /// How long the daemon may take to answer after it starts, e.g. 30s.
    #[arg(long, default_value = "30", value_parser = |s: &str| s.trim_end_matches('s').parse::<u64>().map(Duration::from_secs))]
    start_timeout: Duration,
}

impl Args {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.control);
        if !self.library_path.is_empty() {
            command.env("LD_LIBRARY_PATH", &self.library_path);
        }
        // The daemon starts nvidia-cuda-mps-server, which lives next to it.
        if let Some(dir) = self.control.parent() {
            let path = std::env::var("PATH").unwrap_or_default();
            command.env("PATH", format!("{}:{path}", dir.display()));
        }
        command
    }

    /// Sends one command through the control interface; its output.
    async fn send(&self, line: &str) -> anyhow::Result<String> {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {}", self.control.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(format!("{line}\n").as_bytes()).await?;
        }
        let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
            .await
            .context("the control command did not finish in 10 s")??;
        if !output.status.success() {
            bail!(
                "`{line}`: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn settings(&self) -> anyhow::Result<Vec<String>> {
        let mut lines = Vec::new();
        if let Some(pct) = self.active_thread_percentage {
            lines.push(format!("set_default_active_thread_percentage {pct}"));
        }
        for limit in &self.pinned_mem_limits {
            let (device, value) = limit.split_once('=').with_context(|| {
                format!("--pinned-mem-limit {limit}: expected <device>=<limit>")
            })?;
            lines.push(format!(
                "set_default_device_pinned_mem_limit {device} {value}"
            ));
        }
        Ok(lines)
    }
}

async fn wait_until_answering(args: &Args, daemon: &mut Child) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + args.start_timeout;
    loop {
        if args.send("get_server_list").await.is_ok() {
            return Ok(());
        }
        if let Some(status) = daemon.try_wait()? {
            bail!("the MPS control daemon exited with {status} before it answered");
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the MPS control daemon did not answer within {:?}",
                args.start_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let pipe = std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_default();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let mut daemon = args
        .command()
        .arg("-f")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {} -f", args.control.display()))?;
    wait_until_answering(&args, &mut daemon).await?;
    for line in &settings {
        args.send(line).await?;
    }
    eprintln!(
        "tessera-mps-daemon: the MPS control daemon answers on {pipe} with {} setting(s) applied",
        settings.len()
    );
    tokio::select! {
        status = daemon.wait() => {
            let status = status?;
            eprintln!("tessera-mps-daemon: the MPS control daemon exited with {status}");
            Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        _ = terminate.recv() => {
            eprintln!("tessera-mps-daemon: SIGTERM: stopping the MPS control daemon");
            if let Err(e) = args.send("quit").await {
                eprintln!("tessera-mps-daemon: quit failed ({e:#}); killing the daemon");
                let _ = daemon.start_kill();
            }
            match tokio::time::timeout(Duration::from_secs(8), daemon.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    let _ = daemon.start_kill();
                    let _ = daemon.wait().await;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !Path::new(&args.control).is_file() {
        eprintln!(
            "tessera-mps-daemon: --control {}: no such file; is the driver root mounted?",
            args.control.display()
        );
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tessera-mps-daemon: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tessera-mps-daemon: {e:#}");
            ExitCode::FAILURE
        }
    }
}
