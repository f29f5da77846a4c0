//! Named crash points, so that a process test can stop the plugin binary exactly where a crash
//! would hurt (the random kills of the crash-cycle test find a narrow window only by chance).
//!
//! [`point`] does nothing unless the environment variable [`CRASH_AT`] names it: then the
//! process exits at once with [`CRASH_EXIT_CODE`], running no destructor, no drop guard and no
//! further step of the operation in hand — what the node sees after a SIGKILL, since every write
//! before the point has reached the page cache. `TESSERA_CRASH_AT=<point>` stops at the first
//! time the point is reached, `<point>@<n>` at the n-th. The variable is read once, the first
//! time any point is reached.
//!
//! Hand-written rather than a fail-point crate: those report a failure as a panic or an error
//! return (which the driver survives by design), are compiled only behind a cargo feature (so a
//! test would not run the binary that ships), and need a registry at start; this is twenty lines.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable naming the point to stop at (`<point>` or `<point>@<n>`).
pub const CRASH_AT: &str = "TESSERA_CRASH_AT";
/// The exit code of a process stopped at a crash point (what a test checks it reached it).
pub const CRASH_EXIT_CODE: i32 = 86;

/// The point to stop at and at which hit, from [`CRASH_AT`].
fn target() -> Option<&'static (String, u32)> {
    static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let value = std::env::var(CRASH_AT).ok()?;
            match value.split_once('@') {
                Some((name, nth)) => Some((name.to_owned(), nth.parse().ok()?)),
                None => Some((value, 1)),
            }
        })
        .as_ref()
}

/// Stops the process here if [`CRASH_AT`] names `name` (see the module docs).
pub fn point(name: &'static str) {
    static HITS: AtomicU32 = AtomicU32::new(0);
    let Some((target, nth)) = target() else {
        return;
    };
    if target != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        eprintln!("crash point `{name}` reached: exiting with {CRASH_EXIT_CODE}");
        std::process::exit(CRASH_EXIT_CODE);
    }
}
