//! The `nvidia-imex-ctl` stand-in: asks a daemon's command service.
//!
//! `-q` prints the daemon's state (`READY`, `NOT_READY <why>`, `UNAVAILABLE <why>`) and exits 0
//! only when it is `READY`; `-N` prints every node of the daemon's nodes config with what the
//! daemon knows of it (`-j`: as JSON). The daemon is found by `-u <socket>`, `-i <ip> <port>`, or
//! the command service settings of `-c <config>` (default `/etc/nvidia-imex/config.cfg`): its
//! `IMEX_CMD_UNIX_DOMAIN_PATH`, else `IMEX_CMD_BIND_INTERFACE_IP` (default `127.0.0.1`) and
//! `IMEX_CMD_PORT`. No daemon answering exits 2.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::config::{DEFAULT_CMD_PORT, DEFAULT_CONFIG, ImexConfig};
use super::protocol::StatusReport;

const TIMEOUT: Duration = Duration::from_secs(2);

/// Where the daemon's command service is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Socket(PathBuf),
    Tcp(String, u16),
}

/// What the command line asks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    target: Option<Target>,
    config: PathBuf,
    query: bool,
    nodes: bool,
    json: bool,
}

fn parse(args: &[String]) -> Result<Request, String> {
    let mut request = Request {
        target: None,
        config: PathBuf::from(DEFAULT_CONFIG),
        query: false,
        nodes: false,
        json: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-c" => request.config = PathBuf::from(value()?),
            "-u" => request.target = Some(Target::Socket(PathBuf::from(value()?))),
            "-i" => {
                let ip = value()?;
                let port = value()?;
                let port = port
                    .parse()
                    .map_err(|_| format!("-i: `{port}` is not a port"))?;
                request.target = Some(Target::Tcp(ip, port));
            }
            "-t" => {
                value()?;
            }
            "-q" => request.query = true,
            "-N" => request.nodes = true,
            "-j" => request.json = true,
            other => return Err(format!("`{other}` is not modelled by the stand-in")),
        }
    }
    if request.query == request.nodes {
        return Err("give exactly one of -q and -N".into());
    }
    Ok(request)
}

/// The target a configuration names.
fn from_config(config: &ImexConfig) -> Result<Target, String> {
    if !config.cmd_enabled {
        return Err("the command service is not enabled (IMEX_CMD_ENABLED=1)".into());
    }
    if let Some(path) = &config.cmd_socket {
        return Ok(Target::Socket(path.clone()));
    }
    let ip = config.cmd_bind_ip.clone().unwrap_or("127.0.0.1".into());
    Ok(Target::Tcp(ip, config.cmd_port.unwrap_or(DEFAULT_CMD_PORT)))
}

/// Sends one command line and reads the answer line.
fn ask(target: &Target, command: &str) -> Result<String, String> {
    let mut line = String::new();
    let message = format!("{command}\n");
    match target {
        Target::Socket(path) => {
            let stream = UnixStream::connect(path)
                .map_err(|e| format!("no IMEX daemon answers at {}: {e}", path.display()))?;
            let _ = stream.set_read_timeout(Some(TIMEOUT));
            (&stream)
                .write_all(message.as_bytes())
                .map_err(|e| e.to_string())?;
            BufReader::new(&stream)
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
        }
        Target::Tcp(ip, port) => {
            let address = (ip.as_str(), *port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or(format!("{ip}:{port} is not an address"))?;
            let stream = TcpStream::connect_timeout(&address, TIMEOUT)
                .map_err(|e| format!("no IMEX daemon answers at {address}: {e}"))?;
            let _ = stream.set_read_timeout(Some(TIMEOUT));
            (&stream)
                .write_all(message.as_bytes())
                .map_err(|e| e.to_string())?;
            BufReader::new(&stream)
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
        }
    }
    if line.is_empty() {
        return Err("the IMEX daemon closed the connection without answering".into());
    }
    Ok(line.trim_end().to_owned())
}

/// `-N` without `-j`: one line per node, then the daemon's state.
fn nodes_text(report: &StatusReport) -> String {
    let mut out = String::new();
    for (index, node) in report.nodes.iter().enumerate() {
        out.push_str(&format!(
            "Node #{index} - {} - {}\n",
            node.address,
            node.status.name()
        ));
    }
    out.push_str(&format!("State: {}\n", report.state.line()));
    out
}

/// `nvidia-imex-ctl ...`.
pub fn main(args: &[String]) -> ExitCode {
    let request = match parse(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nvidia-imex-ctl: {e}");
            return ExitCode::from(2);
        }
    };
    let target = match request.target.clone() {
        Some(t) => Ok(t),
        None => ImexConfig::read(&request.config)
            .map_err(|e| e.to_string())
            .and_then(|c| from_config(&c)),
    };
    let command = if request.query { "QUERY" } else { "STATUS" };
    let answer = match target.and_then(|t| ask(&t, command)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nvidia-imex-ctl: {e}");
            return ExitCode::from(2);
        }
    };
    if request.query {
        println!("{answer}");
        return if answer == "READY" {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if request.json {
        println!("{answer}");
        return ExitCode::SUCCESS;
    }
    match serde_json::from_str::<StatusReport>(&answer) {
        Ok(report) => {
            print!("{}", nodes_text(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvidia-imex-ctl: the daemon's answer does not parse: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn command_lines() {
        let r = parse(&args(&["-u", "/run/imex.sock", "-q"])).unwrap();
        assert_eq!(r.target, Some(Target::Socket("/run/imex.sock".into())));
        assert!(r.query && !r.nodes);
        let r = parse(&args(&["-i", "10.0.0.1", "50005", "-N", "-j"])).unwrap();
        assert_eq!(r.target, Some(Target::Tcp("10.0.0.1".into(), 50005)));
        assert!(r.nodes && r.json);
        assert!(parse(&args(&["-q", "-N"])).is_err());
        assert!(parse(&args(&["-n"])).is_err());
        assert!(parse(&args(&["-i", "10.0.0.1", "port", "-q"])).is_err());
    }

    #[test]
    fn config_targets() {
        let path = std::path::Path::new("/c");
        let socket = ImexConfig::parse(
            path,
            "IMEX_NODE_CONFIG_FILE=/n\nIMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH=/s\n",
        )
        .unwrap();
        assert_eq!(from_config(&socket), Ok(Target::Socket("/s".into())));
        let tcp =
            ImexConfig::parse(path, "IMEX_NODE_CONFIG_FILE=/n\nIMEX_CMD_ENABLED=1\n").unwrap();
        assert_eq!(
            from_config(&tcp),
            Ok(Target::Tcp("127.0.0.1".into(), DEFAULT_CMD_PORT))
        );
        let off = ImexConfig::parse(path, "IMEX_NODE_CONFIG_FILE=/n\n").unwrap();
        assert!(from_config(&off).is_err());
    }
}
