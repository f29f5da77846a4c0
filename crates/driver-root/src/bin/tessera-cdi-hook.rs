//! `tessera-cdi-hook`: the OCI hook in Tessera's CDI specs (see `tessera_driver_root::hook`).
//! The node plugin copies it to the host; the container runtime runs it with the container's
//! state on stdin. Keep it small and free of anything the host might lack: release images build
//! it statically (`-C target-feature=+crt-static`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--version") {
        println!("tessera-cdi-hook {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    match tessera_driver_root::hook::run(&args, &mut std::io::stdin()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
