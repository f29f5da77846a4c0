//! The `nvidia-imex` stand-in: a daemon in the foreground that finds itself among the addresses of
//! its nodes config, listens for its peers there, keeps asking every other node's daemon whether
//! their address maps agree, and answers `nvidia-imex-ctl` on its command service.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::config::{
    DEFAULT_CONFIG, HOLDER_FILE, ImexConfig, ImexConfigError, Knobs, LOCK_FILE, map_fingerprint,
    state_dir,
};
use super::protocol::{ImexState, PeerReport, PeerStatus, StatusReport};

/// How often the daemon asks its peers.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long one peer may take to answer.
const PEER_TIMEOUT: Duration = Duration::from_millis(300);

/// What the daemon's threads share.
struct Shared {
    own: String,
    fingerprint: String,
    started: Instant,
    state_dir: Option<PathBuf>,
    peers: Mutex<BTreeMap<String, PeerStatus>>,
}

impl Shared {
    /// The daemon's state now, from the knobs (read again each time).
    fn state(&self) -> ImexState {
        let knobs = Knobs::read(self.state_dir.as_deref());
        if let Some(reason) = knobs.fail {
            return ImexState::Unavailable(reason);
        }
        let elapsed = self.started.elapsed().as_millis();
        if elapsed < u128::from(knobs.ready_after_ms) {
            return ImexState::NotReady(format!(
                "starting ({elapsed} of {} ms)",
                knobs.ready_after_ms
            ));
        }
        ImexState::Ready
    }

    fn report(&self) -> StatusReport {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        StatusReport {
            state: self.state(),
            address: self.own.clone(),
            nodes: peers
                .into_iter()
                .map(|(address, status)| PeerReport { address, status })
                .collect(),
        }
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("nvidia-imex: {message}");
    ExitCode::FAILURE
}

/// `nvidia-imex [-c <config>]`.
pub fn main(args: &[String]) -> ExitCode {
    let mut config_path = PathBuf::from(DEFAULT_CONFIG);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-c" | "--config" => match it.next() {
                Some(p) => config_path = PathBuf::from(p),
                None => return fail("-c needs a configuration file"),
            },
            "-h" | "--help" => {
                println!("usage: nvidia-imex [-c <config.cfg>] (tessera-fake-driver stand-in)");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("nvidia-imex: `{other}` is not modelled by the stand-in");
                return ExitCode::from(2);
            }
        }
    }
    match run(&config_path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(message),
    }
}

fn run(config_path: &Path) -> Result<(), String> {
    let config = ImexConfig::read(config_path).map_err(|e| e.to_string())?;
    if config.daemonize {
        return Err(format!(
            "{}: DAEMONIZE=1 is not modelled: the stand-in runs in the foreground only",
            config_path.display()
        ));
    }
    let nodes = config.nodes().map_err(|e: ImexConfigError| e.to_string())?;
    let state_dir = state_dir();
    // Held until the process ends: the kernel drops the lock with it.
    let _lock = match &state_dir {
        Some(dir) => Some(take_node(dir, config_path)?),
        None => None,
    };
    let (own, listener) = listen_for_peers(&config, &nodes)?;
    if let Some(dir) = &state_dir {
        let holder = format!(
            "pid {} config {} address {own}\n",
            std::process::id(),
            config_path.display()
        );
        let _ = fs::write(dir.join(HOLDER_FILE), holder);
    }
    let shared = Arc::new(Shared {
        fingerprint: map_fingerprint(&nodes),
        started: Instant::now(),
        state_dir,
        peers: Mutex::new(BTreeMap::new()),
        own: own.clone(),
    });
    eprintln!(
        "nvidia-imex: node {own} of {} (port {}), map {}",
        nodes.join(", "),
        config.server_port,
        shared.fingerprint
    );
    serve_commands(&config, &shared)?;
    let server = shared.clone();
    thread::spawn(move || serve_peers(listener, &server));
    let others: Vec<String> = nodes.into_iter().filter(|n| *n != own).collect();
    probe_forever(&shared, &others, config.server_port)
}

/// Takes the node's IMEX lock, or says who holds it.
fn take_node(dir: &Path, config_path: &Path) -> Result<File, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(_) => {
            let holder = fs::read_to_string(dir.join(HOLDER_FILE)).unwrap_or_default();
            Err(format!(
                "another IMEX daemon runs on this node ({}); one daemon per node: not starting \
                 with {}",
                holder.trim(),
                config_path.display()
            ))
        }
    }
}

/// This node's address (`BIND_INTERFACE_IP`, or the first address of the nodes config this
/// machine can listen on) and the listener for peers there.
fn listen_for_peers(
    config: &ImexConfig,
    nodes: &[String],
) -> Result<(String, TcpListener), String> {
    let candidates: Vec<&String> = match &config.bind_ip {
        Some(ip) if nodes.contains(ip) => vec![ip],
        Some(ip) => {
            return Err(format!(
                "BIND_INTERFACE_IP={ip} is not in the nodes config {}",
                config.nodes_file.display()
            ));
        }
        None => nodes.iter().collect(),
    };
    let mut last = String::new();
    for ip in candidates {
        match TcpListener::bind((ip.as_str(), config.server_port)) {
            Ok(listener) => return Ok((ip.clone(), listener)),
            Err(e) => last = format!("{ip}:{}: {e}", config.server_port),
        }
    }
    Err(format!(
        "this node is none of the addresses in {} (last: {last})",
        config.nodes_file.display()
    ))
}

/// Answers peers: `HELLO <address> <map>` gets `OK <own address> <own map>`.
fn serve_peers(listener: TcpListener, shared: &Shared) {
    for stream in listener.incoming().flatten() {
        let _ = stream.set_read_timeout(Some(PEER_TIMEOUT));
        let mut reader = BufReader::new(&stream);
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            continue;
        }
        let reply = format!("OK {} {}\n", shared.own, shared.fingerprint);
        let _ = (&stream).write_all(reply.as_bytes());
    }
}

/// One peer's answer.
fn probe(shared: &Shared, address: &str, port: u16) -> PeerStatus {
    let Some(target) = (address, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
    else {
        return PeerStatus::Unreachable;
    };
    let Ok(stream) = TcpStream::connect_timeout(&target, PEER_TIMEOUT) else {
        return PeerStatus::Unreachable;
    };
    let _ = stream.set_read_timeout(Some(PEER_TIMEOUT));
    let hello = format!("HELLO {} {}\n", shared.own, shared.fingerprint);
    if (&stream).write_all(hello.as_bytes()).is_err() {
        return PeerStatus::Unreachable;
    }
    let mut line = String::new();
    if BufReader::new(&stream).read_line(&mut line).is_err() {
        return PeerStatus::Unreachable;
    }
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["OK", _, map] if map == shared.fingerprint => PeerStatus::Connected,
        ["OK", _, _] => PeerStatus::Mismatch,
        _ => PeerStatus::Unreachable,
    }
}

fn probe_forever(shared: &Shared, others: &[String], port: u16) -> Result<(), String> {
    {
        let mut peers = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.insert(shared.own.clone(), PeerStatus::Self_);
        for other in others {
            peers.insert(other.clone(), PeerStatus::Unreachable);
        }
    }
    loop {
        for other in others {
            let status = probe(shared, other, port);
            let mut peers = shared.peers.lock().unwrap_or_else(|e| e.into_inner());
            if peers.insert(other.clone(), status) != Some(status) {
                eprintln!("nvidia-imex: node {other}: {}", status.name());
            }
        }
        thread::sleep(PROBE_EVERY);
    }
}

/// Starts the command service (a unix socket and/or a TCP port), when enabled.
fn serve_commands(config: &ImexConfig, shared: &Arc<Shared>) -> Result<(), String> {
    if !config.cmd_enabled {
        return Ok(());
    }
    if let Some(path) = &config.cmd_socket {
        // A socket left by an earlier daemon of this configuration.
        let _ = fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o666));
        let shared = shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(&stream, &shared);
            }
        });
    }
    if let Some(port) = config.cmd_port {
        let ip = config.cmd_bind_ip.clone().unwrap_or("0.0.0.0".into());
        let address: SocketAddr = format!("{ip}:{port}")
            .parse()
            .map_err(|e| format!("IMEX_CMD_BIND_INTERFACE_IP={ip}: {e}"))?;
        let listener = TcpListener::bind(address).map_err(|e| format!("{address}: {e}"))?;
        let shared = shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                answer(&stream, &shared);
            }
        });
    }
    Ok(())
}

/// One command: `QUERY` (the state line) or `STATUS` (the JSON report).
fn answer<S>(stream: &S, shared: &Shared)
where
    for<'a> &'a S: std::io::Read + Write,
{
    let mut line = String::new();
    if BufReader::new(stream).read_line(&mut line).is_err() {
        return;
    }
    let reply = match line.trim() {
        "QUERY" => format!("{}\n", shared.state().line()),
        "STATUS" => format!(
            "{}\n",
            serde_json::to_string(&shared.report()).unwrap_or_default()
        ),
        other => format!("ERROR unknown command {other}\n"),
    };
    let mut writer = stream;
    let _ = writer.write_all(reply.as_bytes());
}
