use std::path::Path;

use prometheus_client::registry::Registry;
use tessera_prepare::injection::DriverInjection;

use super::*;
use crate::backend::driver_root::{DriverRootPath, HookInstall};

/// Lays driver `version` under `root` (its libraries in `usr/lib64`), removing any other.
fn lay_driver(root: &Path, version: &str) {
    let dir = root.join("usr/lib64");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so", "libnvidia-ml.so"] {
        std::fs::write(dir.join(format!("{name}.{version}")), b"").unwrap();
    }
}

fn mounted(injection: &DriverInjection) -> Vec<String> {
    injection
        .edits
        .mounts
        .iter()
        .map(|m| m.host_path.clone())
        .collect()
}

/// The GPU operator's root as the chart's default gives it: on the host at
/// `/run/nvidia/driver`, seen by the plugin elsewhere; then the host's own root.
const OPERATOR_ROOT: &str = "/run/nvidia/driver";

/// A temporary node: the operator's root (seen at `<dir>/run-nvidia/driver`, not made) and the
/// host's root (`<dir>/host`, made), in the chart's order of preference.
struct Node {
    dir: tempfile::TempDir,
    roots: DriverRoots,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let hook = dir.path().join("tessera-cdi-hook");
        std::fs::write(&hook, b"").unwrap();
        std::fs::create_dir_all(dir.path().join("host")).unwrap();
        let roots = DriverRoots {
            candidates: vec![
                DriverRootPath {
                    host: OPERATOR_ROOT.into(),
                    container: dir.path().join("run-nvidia/driver"),
                },
                DriverRootPath {
                    host: dir.path().join("host"),
                    container: dir.path().join("host"),
                },
            ],
            dev_root: dir.path().join("dev-root"),
            hook: HookInstall::Installed(hook),
        };
        Node { dir, roots }
    }

    fn operator(&self) -> PathBuf {
        self.roots.candidates[0].container.clone()
    }

    fn host(&self) -> PathBuf {
        self.roots.candidates[1].container.clone()
    }

    /// A watch on what [`DriverRoots::choose`] picks now, and the injection it keeps.
    fn watch(&self) -> (DriverWatch, CurrentInjection) {
        let chosen = self.roots.choose().unwrap();
        let (injection, _, _) = driver_root::load(&self.roots.config(chosen.index)).unwrap();
        let current = CurrentInjection::new(injection);
        let metrics = NodeMetrics::new(&mut Registry::default());
        let watch = DriverWatch::new(self.roots.clone(), chosen, current.clone(), metrics);
        (watch, current)
    }
}

#[test]
fn the_first_complete_candidate_is_chosen_and_none_names_each_with_what_it_lacks() {
    let node = Node::new();
    // Neither: the operator's root is not there (no operator), the host's holds no driver.
    std::fs::write(node.host().join("README"), b"").unwrap();
    let none = node.roots.choose().unwrap_err().to_string();
    assert!(
        none.contains("no NVIDIA driver under any candidate driver root")
            && none.contains(&format!("{OPERATOR_ROOT} does not exist"))
            && none.contains(&format!(
                "{} has no libcuda.so.<version>",
                node.host().display()
            )),
        "{none}"
    );
    // The operator's root made but empty (its driver container has not laid its files yet).
    std::fs::create_dir_all(node.operator()).unwrap();
    let none = node.roots.choose().unwrap_err().to_string();
    assert!(
        none.contains(&format!("{OPERATOR_ROOT} is empty")),
        "{none}"
    );

    // Only the host's: it is chosen.
    lay_driver(&node.host(), "550.54.15");
    let chosen = node.roots.choose().unwrap();
    assert_eq!(
        chosen,
        CompleteRoot {
            index: 1,
            version: "550.54.15".into()
        }
    );
    // Only the operator's.
    std::fs::remove_dir_all(node.host().join("usr")).unwrap();
    lay_driver(&node.operator(), "580.95.05");
    assert_eq!(node.roots.choose().unwrap().index, 0);
    // Both: the operator's, whose driver is the one its container loaded into the kernel.
    lay_driver(&node.host(), "550.54.15");
    assert_eq!(
        node.roots.choose().unwrap(),
        CompleteRoot {
            index: 0,
            version: "580.95.05".into()
        }
    );
}

#[test]
fn one_root_says_which_and_what_it_lacks() {
    let node = Node::new();
    let mut roots = node.roots.clone();
    roots.candidates.remove(0);
    let error = roots.choose().unwrap_err().to_string();
    assert!(
        error.starts_with(&format!(
            "no NVIDIA driver under the driver root: {} is empty",
            node.host().display()
        )),
        "{error}"
    );
}

#[test]
fn specs_name_the_operators_root_at_its_host_path_not_where_the_plugin_sees_it() {
    let node = Node::new();
    lay_driver(&node.operator(), "580.95.05");
    let chosen = node.roots.choose().unwrap();
    let (injection, tools, _) = driver_root::load(&node.roots.config(chosen.index)).unwrap();
    let mounts = mounted(&injection);
    let seen = node.dir.path().display().to_string();
    assert!(
        mounts.contains(&format!("{OPERATOR_ROOT}/usr/lib64/libcuda.so.580.95.05"))
            && mounts.iter().all(|m| !m.contains(&seen)),
        "{mounts:?}"
    );
    // The plugin's own tools run from where it sees the root.
    assert_eq!(
        tools.library_path,
        node.operator().join("usr/lib64").display().to_string()
    );
}

#[test]
fn the_operators_root_getting_a_driver_later_is_moved_to_and_never_away_from() {
    let node = Node::new();
    lay_driver(&node.host(), "550.54.15");
    let (mut watch, current) = node.watch();
    assert_eq!(watch.chosen, 1);
    assert_eq!(watch.check(), DriverCheck::Unchanged);
    // The operator is installed: its root appears, empty, then its driver container lays files.
    std::fs::create_dir_all(node.operator()).unwrap();
    assert_eq!(watch.check(), DriverCheck::Unchanged);
    lay_driver(&node.operator(), "580.95.05");
    let host = node.host();
    assert_eq!(
        watch.check(),
        DriverCheck::Changed {
            change: DriverChange::Root,
            from: DriverAt {
                root: host.clone(),
                version: "550.54.15".into()
            },
            to: DriverAt {
                root: OPERATOR_ROOT.into(),
                version: "580.95.05".into()
            },
        }
    );
    let now = mounted(&current.get());
    assert!(
        now.contains(&format!("{OPERATOR_ROOT}/usr/lib64/libcuda.so.580.95.05"))
            && !now.iter().any(|m| m.contains("550.54.15")),
        "{now:?}"
    );
    assert_eq!(watch.check(), DriverCheck::Unchanged);

    // Mid-upgrade the operator's root is incomplete: the specs keep its last driver rather
    // than the host's leftovers.
    std::fs::remove_dir_all(node.operator().join("usr")).unwrap();
    assert!(
        matches!(watch.check(), DriverCheck::Incomplete(ref lacks) if lacks == "is empty"),
        "{:?}",
        watch.check()
    );
    assert_eq!(watch.chosen, 0);
    assert!(
        mounted(&current.get())
            .iter()
            .any(|m| m.contains("580.95.05"))
    );
    lay_driver(&node.operator(), "580.105.08");
    assert!(matches!(
        watch.check(),
        DriverCheck::Changed {
            change: DriverChange::Version,
            ..
        }
    ));
}

#[test]
fn a_new_driver_version_is_read_for_the_next_specs_and_an_incomplete_root_keeps_the_last() {
    let node = Node::new();
    let mut roots = node.roots.clone();
    // An explicit root: the one candidate.
    roots.candidates.remove(0);
    let root = node.host();
    lay_driver(&root, "550.54.15");
    let config = roots.config(0);
    let (injection, _, summary) = driver_root::load(&config).unwrap();
    assert_eq!(summary.version, "550.54.15");
    let current = CurrentInjection::new(injection);
    let metrics = NodeMetrics::new(&mut Registry::default());
    let chosen = roots.choose().unwrap();
    let mut watch = DriverWatch::new(roots, chosen, current.clone(), metrics);
    assert_eq!(watch.check(), DriverCheck::Unchanged);

    // The upgrade removes the old driver first: nothing complete, the specs keep its files.
    std::fs::remove_dir_all(root.join("usr/lib64")).unwrap();
    assert!(matches!(watch.check(), DriverCheck::Incomplete(_)));
    assert!(
        mounted(&current.get())
            .iter()
            .any(|m| m.ends_with("libcuda.so.550.54.15")),
        "{:?}",
        mounted(&current.get())
    );

    lay_driver(&root, "580.95.05");
    let check = watch.check();
    assert_eq!(
        check,
        DriverCheck::Changed {
            change: DriverChange::Version,
            from: DriverAt {
                root: root.clone(),
                version: "550.54.15".into()
            },
            to: DriverAt {
                root: root.clone(),
                version: "580.95.05".into()
            },
        }
    );
    let now = mounted(&current.get());
    assert!(
        now.iter().any(|m| m.ends_with("libcuda.so.580.95.05"))
            && !now.iter().any(|m| m.contains("550.54.15")),
        "{now:?}"
    );
    assert_eq!(watch.version, "580.95.05");
    assert_eq!(watch.check(), DriverCheck::Unchanged);
    let event = driver_event(&check).unwrap();
    assert_eq!(event.reason, DRIVER_RELOADED_REASON);
    assert!(matches!(event.type_, EventType::Normal));
    let note = event.note.unwrap();
    assert!(
        note.contains("550.54.15") && note.contains("580.95.05"),
        "{note}"
    );
}

#[test]
fn each_change_is_an_event_on_the_node_and_no_change_none() {
    let at = |root: &str, version: &str| DriverAt {
        root: root.into(),
        version: version.into(),
    };
    assert!(driver_event(&DriverCheck::Unchanged).is_none());
    assert!(driver_event(&DriverCheck::Incomplete("is empty".into())).is_none());
    let moved = driver_event(&DriverCheck::Changed {
        change: DriverChange::Root,
        from: at("/", "550.54.15"),
        to: at(OPERATOR_ROOT, "580.95.05"),
    })
    .unwrap();
    assert_eq!(moved.reason, DRIVER_ROOT_CHANGED_REASON);
    let note = moved.note.unwrap();
    assert!(
        note.contains("under / -> driver 580.95.05 under /run/nvidia/driver"),
        "{note}"
    );
    let failed = driver_event(&DriverCheck::ReloadFailed {
        change: DriverChange::Version,
        from: at("/", "550.54.15"),
        to: at("/", "580.95.05"),
        error: "cannot install the CDI hook".into(),
    })
    .unwrap();
    assert_eq!(failed.reason, DRIVER_RELOAD_FAILED_REASON);
    assert!(matches!(failed.type_, EventType::Warning));
    assert!(failed.note.unwrap().contains("cannot install the CDI hook"),);
}
