//! Records what the binaries report as their build (`--version`, `tessera version`, the
//! `tessera_build_info` metric): the git commit the tree was built from and the compiler.
//! `TESSERA_BUILD_GIT_COMMIT` overrides the commit (image builds from a tree without `.git`).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=TESSERA_BUILD_GIT_COMMIT");
    let commit = match std::env::var("TESSERA_BUILD_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            // Rebuild when HEAD moves: HEAD itself (a branch switch) and the branch's ref.
            if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
                println!(
                    "cargo:rerun-if-changed={}",
                    PathBuf::from(&dir).join("HEAD").display()
                );
            }
            if let (Some(common), Some(reference)) = (
                git(&["rev-parse", "--git-common-dir"]),
                git(&["symbolic-ref", "-q", "HEAD"]),
            ) {
                let common = PathBuf::from(common);
                for path in [common.join(&reference), common.join("packed-refs")] {
                    if path.exists() {
                        println!("cargo:rerun-if-changed={}", path.display());
                    }
                }
            }
            // No `-dirty` mark: a build script reruns when HEAD moves, not when a file is
            // edited, so such a mark would go stale.
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TESSERA_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=TESSERA_RUSTC={rustc}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=TESSERA_TARGET={target}");
}
