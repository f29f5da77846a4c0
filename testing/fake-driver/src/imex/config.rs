//! What the IMEX stand-ins read: the daemon's `config.cfg` (the keys the real daemon reads that
//! the stand-ins model), its nodes config (one address per line) and the fake's knobs (a JSON file
//! in the fake driver's state directory that tests write to delay or fail a node's daemon).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The real daemon's default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/nvidia-imex/config.cfg";
/// The real daemon's default port for its peers.
pub const DEFAULT_SERVER_PORT: u16 = 50000;
/// The real daemon's default command port.
pub const DEFAULT_CMD_PORT: u16 = 50005;
/// The knob file, in the fake driver's state directory (`<dev root>/tessera-fake-gpu-state/`).
pub const KNOB_FILE: &str = "imex.json";
/// The node's IMEX lock, in the same directory: one daemon per node, as the real driver admits
/// one process to its fabric management capability.
pub const LOCK_FILE: &str = "imex.lock";
/// Who holds the lock (pid and configuration), for the message a second daemon prints.
pub const HOLDER_FILE: &str = "imex-holder";

/// The keys of `config.cfg` the stand-ins act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexConfig {
    /// `IMEX_NODE_CONFIG_FILE` (required).
    pub nodes_file: PathBuf,
    /// `BIND_INTERFACE_IP`: this node's address; empty: the first address of the nodes config
    /// this machine can listen on.
    pub bind_ip: Option<String>,
    /// `SERVER_PORT`.
    pub server_port: u16,
    /// `IMEX_CMD_ENABLED=1`.
    pub cmd_enabled: bool,
    /// `IMEX_CMD_BIND_INTERFACE_IP` (empty: every interface).
    pub cmd_bind_ip: Option<String>,
    /// `IMEX_CMD_PORT`, when set.
    pub cmd_port: Option<u16>,
    /// `IMEX_CMD_UNIX_DOMAIN_PATH`, when set.
    pub cmd_socket: Option<PathBuf>,
    /// `DAEMONIZE=1` (not modelled: the stand-in refuses it).
    pub daemonize: bool,
}

/// A configuration the stand-ins cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImexConfigError {
    #[error("cannot read {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{}: {key}={value} is not a valid {what}", path.display())]
    Value {
        path: PathBuf,
        key: String,
        value: String,
        what: &'static str,
    },
    #[error("{}: IMEX_NODE_CONFIG_FILE is not set", .0.display())]
    NoNodesFile(PathBuf),
    #[error("{}: no node address (one address per line)", .0.display())]
    NoNodes(PathBuf),
}

fn read(path: &Path) -> Result<String, ImexConfigError> {
    fs::read_to_string(path).map_err(|e| ImexConfigError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// `KEY=VALUE` lines; `#` comments and blank lines skipped.
fn pairs(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

impl ImexConfig {
    /// Reads `path`.
    pub fn read(path: &Path) -> Result<ImexConfig, ImexConfigError> {
        ImexConfig::parse(path, &read(path)?)
    }

    /// Parses the text of `path`.
    pub fn parse(path: &Path, text: &str) -> Result<ImexConfig, ImexConfigError> {
        let values = pairs(text);
        let get = |key: &str| values.get(key).filter(|v| !v.is_empty()).cloned();
        let port = |key: &str, default: Option<u16>| -> Result<Option<u16>, ImexConfigError> {
            match get(key) {
                None => Ok(default),
                Some(v) => v.parse().map(Some).map_err(|_| ImexConfigError::Value {
                    path: path.to_path_buf(),
                    key: key.to_owned(),
                    value: v,
                    what: "port",
                }),
            }
        };
        let nodes_file = get("IMEX_NODE_CONFIG_FILE")
            .map(PathBuf::from)
            .ok_or_else(|| ImexConfigError::NoNodesFile(path.to_path_buf()))?;
        Ok(ImexConfig {
            nodes_file,
            bind_ip: get("BIND_INTERFACE_IP"),
            server_port: port("SERVER_PORT", Some(DEFAULT_SERVER_PORT))?
                .unwrap_or(DEFAULT_SERVER_PORT),
            cmd_enabled: get("IMEX_CMD_ENABLED").as_deref() == Some("1"),
            cmd_bind_ip: get("IMEX_CMD_BIND_INTERFACE_IP"),
            cmd_port: port("IMEX_CMD_PORT", None)?,
            cmd_socket: get("IMEX_CMD_UNIX_DOMAIN_PATH").map(PathBuf::from),
            daemonize: get("DAEMONIZE").as_deref() == Some("1"),
        })
    }

    /// The node addresses of the nodes config, in file order, without repeats.
    pub fn nodes(&self) -> Result<Vec<String>, ImexConfigError> {
        let nodes = parse_nodes(&read(&self.nodes_file)?);
        if nodes.is_empty() {
            return Err(ImexConfigError::NoNodes(self.nodes_file.clone()));
        }
        Ok(nodes)
    }
}

/// One address per line; `#` comments and blank lines skipped; repeats dropped.
pub fn parse_nodes(text: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || nodes.iter().any(|n| n == line) {
            continue;
        }
        nodes.push(line.to_owned());
    }
    nodes
}

/// A short fingerprint of a node list: daemons whose lists differ refuse each other, as real
/// daemons whose address maps disagree do.
pub fn map_fingerprint(nodes: &[String]) -> String {
    // FNV-1a over the joined list: stable across builds and processes.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in nodes.join("\n").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// What a test set for a node's daemon (`<state dir>/imex.json`), read again on every check.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Knobs {
    /// The daemon reports `NOT_READY` until this many milliseconds after it started.
    #[serde(default)]
    pub ready_after_ms: u64,
    /// The daemon reports `UNAVAILABLE <fail>` while this is set (it recovers when it is
    /// removed).
    #[serde(default)]
    pub fail: Option<String>,
}

impl Knobs {
    /// The knobs in `state_dir`; none when there is no file; a file that does not parse reads as
    /// a failure naming it, so a test's typo is seen.
    pub fn read(state_dir: Option<&Path>) -> Knobs {
        let Some(path) = state_dir.map(|d| d.join(KNOB_FILE)) else {
            return Knobs::default();
        };
        match fs::read_to_string(&path) {
            Err(_) => Knobs::default(),
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| Knobs {
                ready_after_ms: 0,
                fail: Some(format!("{} does not parse: {e}", path.display())),
            }),
        }
    }
}

/// The fake driver's state directory of the driver root this program runs from: the root's
/// marker file (`tessera-fake-driver.json`, found above the program) names the device root.
pub fn state_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let arg0 = std::env::args().next().map(PathBuf::from);
    for program in exe.into_iter().chain(arg0) {
        for dir in program.ancestors().skip(1) {
            let marker = dir.join(crate::layout::MARKER_FILE);
            let Ok(text) = fs::read_to_string(&marker) else {
                continue;
            };
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let dev_root = value.get("devRoot")?.as_str()?;
            return Some(tessera_fake_nvml::embedded::state_dir(Path::new(dev_root)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keys_and_defaults() {
        let path = Path::new("/etc/nvidia-imex/config.cfg");
        let config = ImexConfig::parse(
            path,
            "# comment\nIMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n\
             BIND_INTERFACE_IP=\nIMEX_CMD_ENABLED=1\nIMEX_CMD_PORT=50005\n\
             IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/cmd.sock\n",
        )
        .unwrap();
        assert_eq!(
            config,
            ImexConfig {
                nodes_file: "/etc/nvidia-imex/nodes_config.cfg".into(),
                bind_ip: None,
                server_port: DEFAULT_SERVER_PORT,
                cmd_enabled: true,
                cmd_bind_ip: None,
                cmd_port: Some(50005),
                cmd_socket: Some("/etc/nvidia-imex/cmd.sock".into()),
                daemonize: false,
            }
        );
        assert_eq!(
            ImexConfig::parse(path, "SERVER_PORT=5\n"),
            Err(ImexConfigError::NoNodesFile(path.into()))
        );
        assert!(matches!(
            ImexConfig::parse(path, "IMEX_NODE_CONFIG_FILE=/x\nSERVER_PORT=lots\n"),
            Err(ImexConfigError::Value { key, .. }) if key == "SERVER_PORT"
        ));
    }

    #[test]
    fn nodes_config_and_fingerprint() {
        let nodes = parse_nodes("# peers\n10.0.0.1\n\n10.0.0.2\n10.0.0.1\n");
        assert_eq!(nodes, ["10.0.0.1", "10.0.0.2"]);
        let other = parse_nodes("10.0.0.2\n10.0.0.1\n");
        assert_ne!(map_fingerprint(&nodes), map_fingerprint(&other));
        let same = parse_nodes("10.0.0.1\n# the same list, written otherwise\n10.0.0.2\n");
        assert_eq!(map_fingerprint(&nodes), map_fingerprint(&same));
    }

    #[test]
    fn knobs_default_and_typos() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Knobs::read(Some(dir.path())), Knobs::default());
        fs::write(dir.path().join(KNOB_FILE), r#"{"readyAfterMs": 500}"#).unwrap();
        assert_eq!(Knobs::read(Some(dir.path())).ready_after_ms, 500);
        fs::write(dir.path().join(KNOB_FILE), r#"{"fial": "x"}"#).unwrap();
        assert!(
            Knobs::read(Some(dir.path()))
                .fail
                .unwrap()
                .contains("does not parse")
        );
    }
}
