//! What this build is: the release, the git commit, the compiler and the target, for
//! `--version`, `tessera version` and the `tessera_build_info` metric (registered by
//! `tessera_process::build`). `build.rs` records the commit and the compiler.
//!
//! A crate of its own, with no dependencies: its build script reruns whenever HEAD moves (a
//! commit, a rebase, a checkout), and only the crates that report the build are rebuilt then
//! (`tessera-process` and the packages of the binaries: node, controller, cli), never the crates
//! below them. Cargo's dependencies are per package, so a package whose binary reports the
//! commit recompiles its library too.

/// The release (the workspace's version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built (HEAD when built, `TESSERA_BUILD_GIT_COMMIT` when set; `unknown`
/// outside git).
pub const GIT_COMMIT: &str = env!("TESSERA_GIT_COMMIT");
/// `rustc --version` of the compiler that built it.
pub const RUSTC: &str = env!("TESSERA_RUSTC");
/// The target triple built for (`x86_64-unknown-linux-gnu`, `aarch64-unknown-linux-gnu`).
pub const TARGET: &str = env!("TESSERA_TARGET");

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fact_is_recorded_and_the_long_version_lists_them() {
        assert!(RUSTC.starts_with("rustc "), "{RUSTC}");
        assert!(
            !GIT_COMMIT.is_empty() && !GIT_COMMIT.contains('\n'),
            "{GIT_COMMIT:?}"
        );
        assert!(
            TARGET.split('-').count() >= 3,
            "not a target triple: {TARGET}"
        );
        let lines: Vec<&str> = LONG_VERSION.lines().collect();
        assert_eq!(
            lines,
            [
                VERSION.to_owned(),
                format!("commit: {GIT_COMMIT}"),
                format!("compiler: {RUSTC}"),
                format!("target: {TARGET}"),
            ]
        );
    }
}
