//! `tessera-fake-driver-root`: lays out the fake NVIDIA driver root and device root of one mock
//! node from its topology (testing/fake-driver/README.md). Prints a JSON summary on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tessera_fake_driver::layout::{self, Artifacts, Layout, NodeKind};
use tessera_gpu_inventory::{DeviceSource, MockSource};

/// Writes a fake NVIDIA driver root (libraries, loader cache, binaries, firmware) and a device
/// root (stand-in /dev/nvidia* nodes) for one mock node.
#[derive(Debug, Parser)]
#[command(name = "tessera-fake-driver-root", version, max_term_width = 100)]
struct Args {
    /// A shipped topology (dgx-h100, hgx-a100-mig, ...) or a topology file, as the node plugin's
    /// --topology.
    #[arg(long)]
    topology: String,
    /// The node: its GPU and MIG UUIDs are derived from the name, as the node plugin does.
    #[arg(long)]
    node_name: String,
    /// Directory to write the driver root into (created).
    #[arg(long)]
    driver_root: PathBuf,
    /// Directory to write the stand-in device nodes into (`<dir>/dev/...`, created). Must be the
    /// absolute path the node plugin and the container runtime use.
    #[arg(long)]
    dev_root: PathBuf,
    /// Driver install layout.
    #[arg(long, value_enum, default_value_t = Layout::Host)]
    layout: Layout,
    /// Directory holding the built fake-nvml, fake-cuda and stand-in files (default: this
    /// program's directory, i.e. cargo's target/<profile>).
    #[arg(long)]
    artifacts: Option<PathBuf>,
    /// Write regular files instead of character devices (no root needed; a container runtime
    /// refuses them).
    #[arg(long)]
    no_mknod: bool,
}

fn run(args: Args) -> anyhow::Result<()> {
    let artifacts = match args.artifacts {
        Some(dir) => dir,
        None => std::env::current_exe()
            .context("cannot find this program's directory; pass --artifacts")?
            .parent()
            .context("this program has no directory; pass --artifacts")?
            .to_path_buf(),
    };
    anyhow::ensure!(
        args.dev_root.is_absolute(),
        "--dev-root {} must be absolute: the node plugin writes it into CDI specs",
        args.dev_root.display()
    );
    let inventory = MockSource::new(&args.topology)
        .with_context(|| format!("--topology {}", args.topology))?
        .for_node(args.node_name.clone())
        .inventory()
        .with_context(|| format!("--topology {}", args.topology))?;
    let kind = if args.no_mknod {
        NodeKind::RegularFile
    } else {
        NodeKind::CharDevice
    };
    layout::write_dev_root(&args.dev_root, &inventory, kind)?;
    let summary = layout::write_driver_root(
        &args.driver_root,
        args.layout,
        &args.node_name,
        &inventory,
        &args.dev_root,
        &Artifacts::in_dir(artifacts),
    )?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-fake-driver-root: {e:#}");
            ExitCode::FAILURE
        }
    }
}
