use std::path::Path;

use prometheus_client::registry::Registry;
use tessera_prepare::injection::DriverInjection;

use super::*;
use crate::backend::driver_root::HookInstall;

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

#[test]
fn a_new_driver_version_is_read_for_the_next_specs_and_an_incomplete_root_keeps_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("driver");
    let hook = dir.path().join("tessera-cdi-hook");
    std::fs::write(&hook, b"").unwrap();
    lay_driver(&root, "550.54.15");
    let config = DriverRootConfig {
        driver_root: root.clone(),
        container_driver_root: root.clone(),
        dev_root: dir.path().join("dev-root"),
        hook: HookInstall::Installed(hook),
    };
    let (injection, _, summary) = driver_root::load(&config).unwrap();
    assert_eq!(summary.version, "550.54.15");
    let current = CurrentInjection::new(injection);
    let metrics = NodeMetrics::new(&mut Registry::default());
    let mut watch = DriverWatch::new(config, summary.version, current.clone(), metrics);
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
    assert_eq!(
        watch.check(),
        DriverCheck::Changed {
            from: "550.54.15".into(),
            to: "580.95.05".into()
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
}
