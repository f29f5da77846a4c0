//! `tessera`: what a node would publish, why a claim can or cannot be allocated, placement
//! quality on a synthetic cluster, and a linter for DeviceClasses and claims.
//!
//! Each subcommand lives in a module of its own; `main` only parses arguments and dispatches.

mod explain;
mod inventory;
mod schema;
mod simulate;

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
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Schema(a) => schema::run(&a, &mut std::io::stdout().lock()),
        Command::Inventory(a) => inventory::run(&a, &mut std::io::stdout().lock()),
        Command::Explain(a) => explain::run(&a, &mut std::io::stdout().lock()),
        Command::Simulate(a) => simulate::run(&a, &mut std::io::stdout().lock()),
    }
}
