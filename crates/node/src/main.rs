//! `tessera-kubelet-plugin`: flags, logging, the async runtime, and [`NodePlugin`] until SIGTERM
//! or SIGINT (its parts, and the order they stop in: `tessera_node::plugin`).
//!
//! Modules: `args` (the flags, each with its `TESSERA_<FLAG>` variable, into a `NodePluginConfig`).

mod args;

use std::process::ExitCode;

use tessera_node::NodePlugin;

use crate::args::Args;

fn main() -> ExitCode {
    let (args, notices) = tessera_process::env::parse::<Args>(&args::renamed());
    args.log.init();
    for notice in &notices {
        notice.log();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let config = args.plugin_config()?;
    let clients =
        tessera_process::kube_clients(args.client.kubeconfig.as_deref(), args.api_timeout).await?;
    let plugin = NodePlugin::start(config, clients).await?;
    plugin.run(tessera_process::termination()).await?;
    tracing::info!("tessera-kubelet-plugin stopped");
    Ok(())
}
