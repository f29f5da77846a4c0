//! The workspace's own rules, checked by this crate's tests (`cargo test -p tessera-checks`):
//!
//! - `tests/architecture.rs`: docs/ARCHITECTURE.md's dependency invariants over `cargo metadata`,
//!   docs cite only files in the tree, every workspace dependency is used;
//! - `tests/function_length.rs`: no function over the length limit;
//! - `tests/import_circles.rs`: no import circle between the files of one crate;
//! - `tests/public_names.rs`: no two public types of the workspace share a name;
//! - `tests/code_map.rs`: docs/ARCHITECTURE.md has a true section for every crate.
//!
//! This library holds what the checks share: where the workspace is, which crates it has
//! ([`crate_dirs`]) and a crate's modules read from its files ([`module_tree`]).

pub mod module_tree;

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives at `testing/checks`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate directory of the workspace, sorted: the root `Cargo.toml`'s `members`, a
/// `dir/*` entry standing for each directory under `dir` with a `Cargo.toml` (`crates/`: what
/// ships, `testing/`: test-only crates, `tests/e2e`: the end-to-end suite), so a new crate is
/// checked without being named anywhere else.
pub fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut crates = Vec::new();
    for member in workspace_members(root) {
        match member.strip_suffix("/*") {
            Some(dir) => {
                let listing = std::fs::read_dir(root.join(dir))
                    .unwrap_or_else(|e| panic!("{dir}/ is not readable: {e}"));
                for entry in listing {
                    let path = entry.expect("a directory entry").path();
                    if path.join("Cargo.toml").is_file() {
                        crates.push(path);
                    }
                }
            }
            None => crates.push(root.join(member)),
        }
    }
    crates.sort();
    crates
}

/// The entries of `members = [..]` in the workspace's `Cargo.toml` (one line, as it is written).
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("the workspace's Cargo.toml is not readable: {e}"));
    let line = manifest
        .lines()
        .find(|line| line.starts_with("members = ["))
        .expect("the workspace's Cargo.toml has a one-line `members = [..]`");
    let members: Vec<String> = line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!members.is_empty(), "no workspace members in `{line}`");
    members
}
