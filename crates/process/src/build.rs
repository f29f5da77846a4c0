//! What this build is, for `--version`, `tessera version` and the `tessera_build_info` metric
//! both servers export: the facts are recorded by `tessera-build-info` (a leaf crate, so that a
//! new commit rebuilds only the crates that report it), the metric is registered here.

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

pub use tessera_build_info::{GIT_COMMIT, LONG_VERSION, RUSTC, TARGET, VERSION};

/// Registers `tessera_build_info{version, git_commit, rustc} 1` in `registry` (the root one,
/// so the name is the same in both servers).
pub fn register(registry: &mut Registry) {
    registry.register(
        "tessera_build",
        "Tessera's build: version, git commit and compiler (always 1)",
        Info::new(vec![
            ("version".to_owned(), VERSION.to_owned()),
            ("git_commit".to_owned(), GIT_COMMIT.to_owned()),
            ("rustc".to_owned(), RUSTC.to_owned()),
        ]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_info_metric_names_version_commit_and_compiler() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("tessera_build_info{"))
            .unwrap_or_else(|| panic!("no tessera_build_info in\n{text}"));
        assert!(line.ends_with(" 1"), "{line}");
        assert!(line.contains(&format!("version=\"{VERSION}\"")), "{line}");
        assert!(line.contains("git_commit=\""), "{line}");
        assert!(RUSTC.starts_with("rustc "), "{RUSTC}");
        assert!(!GIT_COMMIT.is_empty());
    }
}
