//! What every scenario works with: the client, the runtime observer, plugin control, timeouts,
//! where the examples are, and the namespaces the running scenario touched (cleaned up after
//! it, and dumped when it fails).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, ListParams};
use tessera_api::names::TOPOLOGY_MANAGED_LABEL;

use crate::devices::Published;
use crate::observer::RuntimeObserver;
use crate::plugins::PluginControl;
use crate::wait::{Progress, until};

/// How long the suite waits for each kind of thing. Generous (CI machines are slow and busy),
/// but bounded; `--timeout-scale` stretches them all.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A claim allocated (scheduler or controller).
    pub allocate: Duration,
    /// A pod Running after its claims are allocated (includes prepare).
    pub run: Duration,
    /// A deleted pod gone, and its claims unprepared.
    pub delete: Duration,
    /// A namespace gone.
    pub namespace: Duration,
    /// An event appearing.
    pub event: Duration,
    /// A plugin restarting.
    pub restart: Duration,
}

impl Timeouts {
    pub fn scaled(scale: f64) -> Self {
        let s = |secs: u64| Duration::from_secs_f64(secs as f64 * scale);
        Self {
            allocate: s(90),
            run: s(120),
            delete: s(120),
            namespace: s(180),
            event: s(90),
            restart: s(60),
        }
    }
}

pub struct Ctx {
    pub client: kube::Client,
    pub observer: RuntimeObserver,
    pub plugins: PluginControl,
    pub timeouts: Timeouts,
    /// deploy/examples.
    pub examples_dir: PathBuf,
    /// The kubeconfig the suite reads the cluster with, for the CLI it runs (`kubectl tessera`).
    pub kubeconfig: Option<PathBuf>,
    /// Namespaces the running scenario created; dumped on failure, deleted afterwards.
    namespaces: Mutex<Vec<String>>,
}

impl Ctx {
    pub fn new(
        client: kube::Client,
        observer: RuntimeObserver,
        plugins: PluginControl,
        timeouts: Timeouts,
        examples_dir: PathBuf,
    ) -> Self {
        Self {
            client,
            observer,
            plugins,
            timeouts,
            examples_dir,
            kubeconfig: None,
            namespaces: Mutex::new(Vec::new()),
        }
    }

    /// Prints a step of the running scenario.
    pub fn say(&self, text: impl AsRef<str>) {
        for line in text.as_ref().lines() {
            println!("    {line}");
        }
    }

    /// Remembers `namespace` as the running scenario's.
    pub fn track_namespace(&self, namespace: &str) {
        let mut namespaces = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        if !namespaces.iter().any(|n| n == namespace) {
            namespaces.push(namespace.to_owned());
        }
    }

    /// The namespaces tracked since the last call, clearing the list.
    pub fn take_namespaces(&self) -> Vec<String> {
        std::mem::take(&mut *self.namespaces.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The tracked namespaces (for dumps).
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes sure `namespace` does not exist (a leftover of an earlier run is deleted first)
    /// and tracks it.
    pub async fn fresh_namespace(&self, namespace: &str) -> anyhow::Result<()> {
        self.track_namespace(namespace);
        let api = Api::<Namespace>::all(self.client.clone());
        if api.get_opt(namespace).await?.is_some() {
            self.say(format!(
                "deleting namespace {namespace} left by an earlier run"
            ));
            self.delete_namespace(namespace).await?;
        }
        Ok(())
    }

    /// Deletes `namespace` and waits until it is gone.
    pub async fn delete_namespace(&self, namespace: &str) -> anyhow::Result<()> {
        let api = Api::<Namespace>::all(self.client.clone());
        match api.delete(namespace, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(error) => {
                return Err(error).with_context(|| format!("cannot delete namespace {namespace}"));
            }
        }
        until(
            &format!("namespace {namespace} to be deleted"),
            self.timeouts.namespace,
            || async {
                Ok(match api.get_opt(namespace).await? {
                    None => Progress::Done(()),
                    Some(ns) => Progress::Waiting(format!(
                        "phase {}",
                        ns.status.and_then(|s| s.phase).unwrap_or_default()
                    )),
                })
            },
        )
        .await
    }

    /// The devices published right now.
    pub async fn published(&self) -> anyhow::Result<Published> {
        Published::list(&self.client).await
    }

    /// The nodes labelled `gpu.tessera.dev/topology-managed=true`.
    pub async fn managed_nodes(&self) -> anyhow::Result<Vec<String>> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&format!("{TOPOLOGY_MANAGED_LABEL}=true")))
            .await
            .context("cannot list nodes")?;
        let mut names: Vec<String> = nodes
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        names.sort();
        Ok(names)
    }
}
