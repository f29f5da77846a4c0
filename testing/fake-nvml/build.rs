//! Gives the cdylib the fake driver libraries' placeholder soname, and builds the test fixture `libnvml_without_shutdown.so` (fixtures/nvml_without_shutdown.rs) into
//! OUT_DIR with the same rustc that builds this crate, so the integration tests find it under any
//! `cargo test` invocation. It is a plain cdylib with no dependencies.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    // A placeholder soname, the same in every fake driver library (see
    // testing/fake-driver/src/soname_placeholder.txt): the fake driver root tool writes the real
    // one, `libnvidia-ml.so.1`, into its copy. (Cargo also passes a dependency's cdylib link
    // arguments to its dependents' cdylibs, so a per-crate soname here would leak into
    // tessera-fake-driver's library; identical placeholders make that harmless.)
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,-soname,libtessera-fake-driver-stub.so.SONAME-PLACEHOLDER-0123456789abcdefghijklmnopqrstuvwxyz-END"
    );
    let source = "fixtures/nvml_without_shutdown.rs";
    println!("cargo:rerun-if-changed={source}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let status = Command::new(rustc)
        .args([
            "--crate-type=cdylib",
            "--edition=2024",
            "--crate-name=nvml_without_shutdown",
        ])
        .args(["--target", &target, "-C", "opt-level=0", "--out-dir"])
        .arg(&out_dir)
        .arg(source)
        .status()
        .expect("run rustc for the nvml_without_shutdown fixture");
    assert!(status.success(), "compiling {source} failed");
}
