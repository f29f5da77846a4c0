//! `tessera`: what a node would publish, why a claim can or cannot be allocated, placement
//! quality on a synthetic cluster, a linter for DeviceClasses and claims, and the migration of
//! NVIDIA DRA manifests and device-plugin configs.
//!
//! Each subcommand lives in a module of its own; `main` only parses arguments and dispatches.

mod explain;
mod inventory;
mod migrate;
mod schema;
mod simulate;
mod validate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: a DRA driver for NVIDIA GPUs"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the attributes and capacities Tessera publishes, for writing CEL selectors.
    Schema(schema::SchemaArgs),
    /// Print the ResourceSlices a node would publish, from a topology or from NVML.
    Inventory(inventory::InventoryArgs),
    /// Explain why a claim can or cannot be allocated, node by node and device by device.
    Explain(explain::ExplainArgs),
    /// Compare first-fit and topology-aware placement on a synthetic cluster and claim trace.
    #[command(long_about = simulate::LONG_ABOUT)]
    Simulate(simulate::SimulateArgs),
    /// Lint DeviceClasses, ResourceClaims and ResourceClaimTemplates: CEL selectors, attribute
    /// names, opaque configs. Exit status 0 when clean, 1 with findings, 2 on unreadable input.
    Validate(validate::ValidateArgs),
    /// Rewrite NVIDIA DRA manifests (gpu.nvidia.com classes, CEL, resource.nvidia.com/v1beta1
    /// configs) and NVIDIA device-plugin configs (replicas, MIG strategy) into Tessera objects
    /// and chart values. Changes and what could not be carried over go to stderr. Exit status 0
    /// when everything was carried over, 1 when something was not, 2 on unreadable input.
    #[command(long_about = None)]
    Migrate(migrate::MigrateArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line; a backtrace (which `Result`
            // from main would print under RUST_BACKTRACE) is noise for a user's input error.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let out = &mut std::io::stdout().lock();
    match args.command {
        Command::Schema(a) => schema::run(&a, out).map(|()| ExitCode::SUCCESS),
        Command::Inventory(a) => inventory::run(&a, out).map(|()| ExitCode::SUCCESS),
        Command::Explain(a) => explain::run(&a, out).map(|()| ExitCode::SUCCESS),
        Command::Simulate(a) => simulate::run(&a, out).map(|()| ExitCode::SUCCESS),
        Command::Validate(a) => validate::run(&a, out, &mut std::io::stderr().lock()),
        Command::Migrate(a) => migrate::run(&a, out, &mut std::io::stderr().lock()),
    }
}
