//! The Kubernetes client: from a kubeconfig file when one is given, else the in-cluster
//! service account.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("cannot read the kubeconfig {path}: {source}; check --kubeconfig (or $KUBECONFIG)")]
    ReadKubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig was read but its current context is not usable.
    #[error(
        "cannot use the kubeconfig {path}: {source}; check its current context, cluster and user"
    )]
    UseKubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and the process does not run in a pod.
    #[error(
        "no --kubeconfig and the in-cluster configuration is not available ({source}); pass --kubeconfig or run in a pod"
    )]
    InCluster {
        source: kube::config::InClusterError,
    },
    /// The configuration was found but the client could not be built from it (TLS, proxy).
    #[error("cannot build the Kubernetes client: {source}")]
    Build { source: kube::Error },
}

/// The client for `kubeconfig`, or for the in-cluster service account when it is `None`.
pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    build(kube_config(kubeconfig).await?)
}

/// Two clients of one configuration: `requests` bounds every call (connect by `timeout`, reads
/// and writes by `timeout` plus 2 s, a backstop behind calls' own deadlines); `watches` keeps
/// kube's long read timeout, which a watch needs (the server holds it open for minutes).
#[derive(Clone)]
pub struct Clients {
    pub requests: kube::Client,
    pub watches: kube::Client,
}

/// [`Clients`] for `kubeconfig` (or in-cluster), requests bounded by `timeout`.
pub async fn kube_clients(
    kubeconfig: Option<&Path>,
    timeout: Duration,
) -> Result<Clients, ClientError> {
    let config = kube_config(kubeconfig).await?;
    let backstop = timeout + Duration::from_secs(2);
    let mut bounded = config.clone();
    bounded.connect_timeout = Some(timeout);
    bounded.read_timeout = Some(backstop);
    bounded.write_timeout = Some(backstop);
    Ok(Clients {
        requests: build(bounded)?,
        watches: build(config)?,
    })
}

fn build(config: kube::Config) -> Result<kube::Client, ClientError> {
    kube::Client::try_from(config).map_err(|source| ClientError::Build { source })
}

async fn kube_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    Ok(match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).map_err(|source| ClientError::ReadKubeconfig {
                    path: path.to_owned(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::UseKubeconfig {
                    path: path.to_owned(),
                    source,
                })?
        }
        None => kube::Config::incluster().map_err(|source| ClientError::InCluster { source })?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named() {
        let Err(error) = kube_client(Some(Path::new("/nonexistent/kubeconfig"))).await else {
            panic!("a client from a missing kubeconfig");
        };
        assert!(
            matches!(error, ClientError::ReadKubeconfig { .. }),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("/nonexistent/kubeconfig"),
            "{error}"
        );
    }
}

/// `--kubeconfig`, the same in every binary that talks to the API server.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Kubeconfig to reach the API server; the in-cluster service account when absent
    /// [also read from $KUBECONFIG].
    #[arg(long, env = "TESSERA_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}
