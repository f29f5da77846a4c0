//! The IMEX stand-ins of a gb200-tray fake root, run from the root the way Tessera runs them:
//! three nodes' daemons on loopback addresses find each other, answer `nvidia-imex-ctl`, follow
//! the test's knobs, refuse a second daemon on one node and disagree with a peer whose map
//! differs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tessera_fake_driver::imex::config::{HOLDER_FILE, KNOB_FILE};
use tessera_fake_driver::imex::protocol::{ImexState, PeerStatus, StatusReport};
use tessera_fake_driver::layout::{self, Artifacts, Layout, NodeKind};
use tessera_gpu_inventory::{DeviceSource, MockSource};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// One fake gb200 tray: its driver root, device root and IMEX directory.
struct Tray {
    root: PathBuf,
    dev_root: PathBuf,
    imex_dir: PathBuf,
    address: String,
}

/// Kills the daemons a test started, whatever happens.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port free on every loopback address (peers share the port, as real daemons do).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Tray {
    fn new(dir: &Path, name: &str, address: &str) -> Tray {
        let inventory = MockSource::new("gb200-tray")
            .unwrap()
            .for_node(name)
            .inventory()
            .unwrap();
        let root = dir.join(name).join("driver");
        let dev_root = dir.join(name).join("dev-root");
        layout::write_dev_root(&dev_root, &inventory, NodeKind::RegularFile).unwrap();
        let artifacts = Artifacts::in_dir(target_dir())
            .with_tool(env!("CARGO_BIN_EXE_tessera-fake-driver-tool"));
        layout::write_driver_root(&root, Layout::Host, name, &inventory, &dev_root, &artifacts)
            .unwrap();
        let imex_dir = dir.join(name).join("imex");
        std::fs::create_dir_all(&imex_dir).unwrap();
        Tray {
            root,
            dev_root,
            imex_dir,
            address: address.to_owned(),
        }
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.root.join("usr/bin").join(name)
    }

    fn state_dir(&self) -> PathBuf {
        self.dev_root.join("tessera-fake-gpu-state")
    }

    /// Writes this tray's config for `peers` and returns its path.
    fn configure(&self, peers: &[&str], port: u16) -> PathBuf {
        let nodes = self.imex_dir.join("nodes_config.cfg");
        std::fs::write(&nodes, peers.join("\n") + "\n").unwrap();
        let config = self.imex_dir.join("config.cfg");
        std::fs::write(
            &config,
            format!(
                "IMEX_NODE_CONFIG_FILE={}\nBIND_INTERFACE_IP={}\nSERVER_PORT={port}\n\
                 IMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH={}\nDAEMONIZE=0\n",
                nodes.display(),
                self.address,
                self.imex_dir.join("cmd.sock").display()
            ),
        )
        .unwrap();
        config
    }

    fn start(&self, config: &Path) -> Child {
        Command::new(self.binary("nvidia-imex"))
            .args(["-c", &config.display().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn ctl(&self, args: &[&str]) -> Output {
        let socket = self.imex_dir.join("cmd.sock").display().to_string();
        Command::new(self.binary("nvidia-imex-ctl"))
            .args(["-u", &socket])
            .args(args)
            .output()
            .unwrap()
    }

    fn report(&self) -> Option<StatusReport> {
        let out = self.ctl(&["-N", "-j"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }
}

/// Waits until `check` holds, for at most 15 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn statuses(report: &StatusReport) -> Vec<(String, PeerStatus)> {
    report
        .nodes
        .iter()
        .map(|n| (n.address.clone(), n.status))
        .collect()
}

#[test]
fn daemons_of_three_trays_find_each_other_and_follow_their_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let addresses = ["127.0.21.1", "127.0.21.2", "127.0.21.3"];
    let trays: Vec<Tray> = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| Tray::new(dir.path(), &format!("tray-{i}"), a))
        .collect();
    assert!(
        trays[0]
            .dev_root
            .join("dev/nvidia-caps-imex-channels/channel0")
            .exists()
    );
    let port = free_port();
    // Tray 0 starts slow: NOT_READY for 1.5 s.
    std::fs::create_dir_all(trays[0].state_dir()).unwrap();
    std::fs::write(
        trays[0].state_dir().join(KNOB_FILE),
        r#"{"readyAfterMs": 1500}"#,
    )
    .unwrap();
    let mut daemons = Daemons(Vec::new());
    for tray in &trays {
        let config = tray.configure(&addresses, port);
        daemons.0.push(tray.start(&config));
    }
    eventually("tray 0's daemon answers", || trays[0].report().is_some());
    let early = trays[0].ctl(&["-q"]);
    assert_eq!(early.status.code(), Some(1), "{early:?}");
    assert!(String::from_utf8_lossy(&early.stdout).starts_with("NOT_READY"));
    eventually("every daemon is READY", || {
        trays.iter().all(|t| t.ctl(&["-q"]).status.success())
    });
    eventually("every daemon reaches the other two", || {
        trays.iter().all(|t| {
            t.report().is_some_and(|r| {
                r.nodes
                    .iter()
                    .all(|n| matches!(n.status, PeerStatus::Connected | PeerStatus::Self_))
            })
        })
    });
    let report = trays[1].report().unwrap();
    assert_eq!(report.address, "127.0.21.2");
    assert_eq!(
        statuses(&report),
        [
            ("127.0.21.1".to_owned(), PeerStatus::Connected),
            ("127.0.21.2".to_owned(), PeerStatus::Self_),
            ("127.0.21.3".to_owned(), PeerStatus::Connected),
        ]
    );

    failure_knob_shows_and_goes(&trays[2]);
    a_second_daemon_on_a_node_is_refused(&trays[1]);
}

/// A failure set by the test shows at once and goes with the knob.
fn failure_knob_shows_and_goes(tray: &Tray) {
    std::fs::create_dir_all(tray.state_dir()).unwrap();
    std::fs::write(tray.state_dir().join(KNOB_FILE), r#"{"fail": "link down"}"#).unwrap();
    assert_eq!(
        tray.report().unwrap().state,
        ImexState::Unavailable("link down".into())
    );
    let failed = tray.ctl(&["-q"]);
    assert_eq!(
        String::from_utf8_lossy(&failed.stdout),
        "UNAVAILABLE link down\n"
    );
    std::fs::remove_file(tray.state_dir().join(KNOB_FILE)).unwrap();
    assert!(tray.ctl(&["-q"]).status.success());
}

/// One daemon per node: a second one on the tray is refused, naming the first.
fn a_second_daemon_on_a_node_is_refused(tray: &Tray) {
    let other = tray.imex_dir.join("second");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("nodes.cfg"), "127.0.21.2\n").unwrap();
    let second_config = other.join("config.cfg");
    std::fs::write(
        &second_config,
        format!("IMEX_NODE_CONFIG_FILE={}/nodes.cfg\n", other.display()),
    )
    .unwrap();
    let second = Command::new(tray.binary("nvidia-imex"))
        .args(["-c", &second_config.display().to_string()])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let holder = std::fs::read_to_string(tray.state_dir().join(HOLDER_FILE)).unwrap();
    assert!(
        String::from_utf8_lossy(&second.stderr).contains(holder.trim()),
        "{second:?}"
    );
}

#[test]
fn peers_whose_maps_differ_disagree_and_no_daemon_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let a = Tray::new(dir.path(), "tray-a", "127.0.22.1");
    let b = Tray::new(dir.path(), "tray-b", "127.0.22.2");
    assert_eq!(
        a.ctl(&["-q"]).status.code(),
        Some(2),
        "no daemon answers yet"
    );
    let port = free_port();
    // b was told about a third node that a does not know.
    let config_a = a.configure(&["127.0.22.1", "127.0.22.2"], port);
    let config_b = b.configure(&["127.0.22.1", "127.0.22.2", "127.0.22.3"], port);
    let _daemons = Daemons(vec![a.start(&config_a), b.start(&config_b)]);
    eventually("a sees b's other map", || {
        a.report().is_some_and(|r| {
            statuses(&r).contains(&("127.0.22.2".to_owned(), PeerStatus::Mismatch))
        })
    });
    eventually("b finds nothing at the third address", || {
        b.report().is_some_and(|r| {
            statuses(&r).contains(&("127.0.22.3".to_owned(), PeerStatus::Unreachable))
                && statuses(&r).contains(&("127.0.22.1".to_owned(), PeerStatus::Mismatch))
        })
    });
    let text = b.ctl(&["-N"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("Node #2 - 127.0.22.3 - UNREACHABLE"),
        "{text:?}"
    );
}
