//! What this build is: the version, the git commit and the compiler, for `--version`,
//! `tessera version` and the `tessera_build_info` metric both servers export. `build.rs`
//! records the commit and the compiler.

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The release (the workspace's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built (HEAD when built; `unknown` outside git).
pub const GIT_COMMIT: &str = env!("TESSERA_GIT_COMMIT");
/// `rustc --version` of the compiler that built it.
pub const RUSTC: &str = env!("TESSERA_RUSTC");

/// `--version`'s long text: the version, then the commit, the compiler and the target, a line
/// each.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("TESSERA_GIT_COMMIT"),
    "\ncompiler: ",
    env!("TESSERA_RUSTC"),
    "\ntarget: ",
    env!("TESSERA_TARGET"),
);

/// The target triple built for (`x86_64-unknown-linux-gnu`, `aarch64-unknown-linux-gnu`).
pub const TARGET: &str = env!("TESSERA_TARGET");

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
