//! The multi-call stand-in binary: what it does depends on the name it runs under (`argv[0]`),
//! since a fake driver root installs one copy per driver binary. Run as
//! `tessera-fake-driver-tool <name> [args]` it acts as `<name>`.

use std::path::Path;
use std::process::ExitCode;

use crate::{imex, mps, smi};

/// For a test executable that is also a fake root's binaries (the root hard-links it under
/// their names): when `argv[0]` names one of [`crate::layout::BINARIES`] or
/// [`crate::layout::IMEX_BINARIES`], runs that stand-in
/// and returns its exit status; otherwise `None` (run the tests).
pub fn main_if_named(argv: &[String]) -> Option<ExitCode> {
    let name = Path::new(argv.first()?).file_name()?.to_string_lossy();
    let mut known = crate::layout::BINARIES
        .iter()
        .chain(crate::layout::IMEX_BINARIES);
    known.any(|b| *b == name).then(|| main(argv.to_vec()))
}

/// Runs the stand-in named by `argv[0]` (or the first argument).
pub fn main(argv: Vec<String>) -> ExitCode {
    let name = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (name, args) = if name == crate::layout::TOOL_BINARY
        || name.starts_with("tessera-fake-driver-tool")
    {
        match argv.get(1) {
            Some(first) => (first.clone(), &argv[2..]),
            None => {
                eprintln!(
                    "usage: tessera-fake-driver-tool <nvidia-smi|nvidia-cuda-mps-control|nvidia-imex|nvidia-imex-ctl|...> [args]"
                );
                return ExitCode::from(2);
            }
        }
    } else {
        (name, &argv[1.min(argv.len())..])
    };
    match name.as_str() {
        "nvidia-smi" => smi::main(args),
        "nvidia-cuda-mps-control" => mps::control_main(args),
        "nvidia-cuda-mps-server" => mps::server_main(args),
        "nvidia-imex" => imex::daemon::main(args),
        "nvidia-imex-ctl" => imex::ctl::main(args),
        "nvidia-debugdump" | "nvidia-persistenced" => {
            eprintln!(
                "{name}: stand-in of a fake driver root (tessera-fake-driver); it does nothing"
            );
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("tessera-fake-driver-tool: no stand-in is called `{other}`");
            ExitCode::from(2)
        }
    }
}
