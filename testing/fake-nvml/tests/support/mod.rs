//! Shared by the integration tests: where the built libraries are, and how to run a test body in
//! its own process. NVML state is process-global (one library, loaded once, one driver state), so
//! every test that initialises the fake runs in a fresh child process of this test binary with its
//! own environment, and cannot interfere with another.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use tessera_fake_nvml::{EVENTS_ENV, LIBRARY_FILE_NAME, LOST_GPUS_ENV, SAMPLES_ENV, TOPOLOGY_ENV};

/// Set in a child process to the name of the test it must run.
const CHILD_ENV: &str = "TESSERA_FAKE_NVML_TEST_CHILD";

/// The fake NVML library cargo built for this test run: `target/<profile>/deps/` holds the test
/// executable, and the cdylib lies in the same directory (or its parent).
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let deps = exe.parent().expect("the test executable is in a directory");
    [
        deps.join(LIBRARY_FILE_NAME),
        deps.join("..").join(LIBRARY_FILE_NAME),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .unwrap_or_else(|| {
        panic!(
            "{LIBRARY_FILE_NAME} is not next to {}: cargo builds it with this package's tests",
            exe.display()
        )
    })
}

/// The fixture library that exports `nvmlInit_v2` but not `nvmlShutdown` (built by build.rs).
pub fn library_without_shutdown() -> PathBuf {
    PathBuf::from(env!("OUT_DIR")).join("libnvml_without_shutdown.so")
}

/// Whether this process is the child that runs `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(test)
}

/// Runs the test function `test` (its full name, as `cargo test -- --exact` takes it) again in a
/// child process with the fake's configuration variables cleared and `env` added, and fails with the child's output if the child fails.
/// The test function calls this when [`is_child`] is false and does its work when it is true.
pub fn run_in_child(test: &str, env: &[(&str, String)]) -> Result<(), String> {
    let exe = std::env::current_exe().expect("path of the test executable");
    let output = Command::new(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, test)
        .env_remove(TOPOLOGY_ENV)
        .env_remove(EVENTS_ENV)
        .env_remove(LOST_GPUS_ENV)
        .env_remove(SAMPLES_ENV)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .expect("spawn the test executable");
    // libtest exits 0 when the filter matched nothing: make sure the test really ran.
    let stdout = String::from_utf8_lossy(&output.stdout);
    if output.status.success() && stdout.contains("1 passed") {
        Ok(())
    } else {
        Err(format!(
            "child `{test}` with {env:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
