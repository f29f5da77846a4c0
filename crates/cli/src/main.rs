//! `tessera`: what a node would publish, why a claim can or cannot be allocated, placement
//! quality on a synthetic cluster, a linter for DeviceClasses and claims, the migration of
//! NVIDIA DRA manifests and device-plugin configs, and who holds which GPU (`top`).
//!
//! Each subcommand lives in a module of its own; `main` only parses arguments and dispatches.
//! Installed as `kubectl-tessera` (a link or copy of the same binary), it is the kubectl plugin
//! `kubectl tessera`: the name it was started under picks the name its help and completions use.
//!
//! Modules, from the ground up (a module imports only from modules on its line or the lines before):
//! - `output` (the `-o text|json` flag of the report commands), `objects` (the objects `explain`
//!   and `top` answer from, read from `--objects` files), `schema`, `inventory`;
//! - `live` (the same objects listed from the live cluster, and the plugins' GPU utilization);
//! - the other subcommands: `validate`, `migrate`, `top`, `explain` (`claim`, `domain`, `group`, `pod`),
//!   `simulate` (`scenario`, `trace`, `cluster` and `stats` below `gangs` and `sharing`).

mod explain;
mod inventory;
mod live;
mod migrate;
mod objects;
mod output;
mod schema;
mod simulate;
mod top;
mod validate;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    long_version = tessera_process::build::LONG_VERSION,
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
    ///
    /// With `-o json`: `{"node", "allocation", "unsatisfiable": [{"node", "reasons"}]}`.
    Explain(explain::ExplainArgs),
    /// Compare first-fit and topology-aware placement on a synthetic cluster and claim trace.
    #[command(long_about = simulate::LONG_ABOUT)]
    Simulate(simulate::SimulateArgs),
    /// Lint DeviceClasses, ResourceClaims, ResourceClaimTemplates and ResourceQuotas: CEL
    /// selectors, attribute names, opaque configs, GPU quota keys that are never enforced. Exit status 0 when clean, 1 with findings, 2 on unreadable input.
    ///
    /// With `-o json`: `{"findings": [{"file", "object", "path", "problem"}], "checked", "files",
    /// "unreadable": [{"file", "error"}]}` on stdout.
    Validate(validate::ValidateArgs),
    /// Rewrite NVIDIA DRA manifests (gpu.nvidia.com classes, CEL, resource.nvidia.com/v1beta1
    /// configs) and NVIDIA device-plugin configs (replicas, MIG strategy) into Tessera objects
    /// and chart values. Changes and what could not be carried over go to stderr. Exit status 0
    /// when everything was carried over, 1 when something was not, 2 on unreadable input.
    #[command(long_about = None)]
    Migrate(migrate::MigrateArgs),
    /// Show the cluster's GPUs and who holds them: per node each GPU (and MIG device in use)
    /// with its product, NVLink island, claim and pods, then free GPUs per island. Reads the live
    /// cluster (kubeconfig) or --objects files.
    Top(top::TopArgs),
    /// Print a shell completion script: `source <(tessera completions bash)`; as a kubectl plugin,
    /// `kubectl-tessera completions bash`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print this build: version, git commit, compiler and target (what the servers export as
    /// the `tessera_build_info` metric).
    Version(VersionArgs),
}

#[derive(Debug, clap::Args)]
struct VersionArgs {
    #[command(flatten)]
    output: output::Output,
}

fn version(args: &VersionArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    use tessera_process::build::{GIT_COMMIT, RUSTC, TARGET, VERSION};
    match args.output.format {
        output::OutputFormat::Text => writeln!(
            out,
            "tessera {VERSION}\ncommit: {GIT_COMMIT}\ncompiler: {RUSTC}\ntarget: {TARGET}"
        )?,
        output::OutputFormat::Json => writeln!(
            out,
            "{}",
            serde_json::json!({
                "version": VERSION,
                "gitCommit": GIT_COMMIT,
                "rustc": RUSTC,
                "target": TARGET,
            })
        )?,
    }
    Ok(())
}

/// The kubectl plugin's file name: started under it, the CLI calls itself `kubectl tessera`.
const KUBECTL_PLUGIN: &str = "kubectl-tessera";

/// The command, named after how it was started.
fn command() -> clap::Command {
    let started_as = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let command = Args::command();
    if started_as.starts_with(KUBECTL_PLUGIN) {
        command.bin_name("kubectl tessera").name(KUBECTL_PLUGIN)
    } else {
        command
    }
}

fn main() -> ExitCode {
    let mut command = command();
    let args = match Args::from_arg_matches(&command.clone().get_matches()) {
        Ok(args) => args,
        Err(e) => e.format(&mut command).exit(),
    };
    if let Command::Completions { shell } = &args.command {
        let name = command.get_name().to_owned();
        clap_complete::generate(*shell, &mut command, name, &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
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
        Command::Top(a) => top::run(&a, out).map(|()| ExitCode::SUCCESS),
        Command::Completions { .. } => Ok(ExitCode::SUCCESS),
        Command::Version(a) => version(&a, out).map(|()| ExitCode::SUCCESS),
    }
}
