//! The workspace's own rules, checked by this crate's tests (`cargo test -p tessera-checks`):
//!
//! - `tests/architecture.rs`: docs/ARCHITECTURE.md's dependency invariants over `cargo metadata`,
//!   docs cite only files in the tree, every workspace dependency is used;
//! - `tests/function_length.rs`: no function over the length limit.
//!
//! This library holds what the checks share: where the workspace is and which crates it has.

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives at `testing/checks`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directories that hold the workspace's crates: `crates/` (what ships) and `testing/`
/// (test-only crates), in that order.
pub const CRATE_DIRS: &[&str] = &["crates", "testing"];

/// Every crate directory under [`CRATE_DIRS`] (a directory with a `Cargo.toml`), sorted.
pub fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut crates = Vec::new();
    for dir in CRATE_DIRS {
        let listing = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}/ is not readable: {e}"));
        for entry in listing {
            let path = entry.expect("a directory entry").path();
            if path.join("Cargo.toml").is_file() {
                crates.push(path);
            }
        }
    }
    crates.sort();
    crates
}
