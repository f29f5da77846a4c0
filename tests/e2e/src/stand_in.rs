//! A stand-in kubelet plugin for another vendor's DRA driver (`nic.example.com` of
//! deploy/examples/gpu-nic-aligned), registered with the kubelet of every node of the local
//! cluster. The kubelet prepares a claim with every driver that allocated a device of it, so a
//! pod whose claims hold a Tessera GPU and a stand-in NIC starts only if some plugin answers for
//! the NIC driver. This one publishes nothing (the example's own ResourceSlice stands in for the
//! NIC driver's devices) and prepares every claim with no device for the container runtime (no
//! CDI id); it records which claims each node's kubelet prepared and unprepared, so a scenario can
//! check that the kubelet really went through it.
//!
//! Built on crates/kubelet-grpc, the same registration and DRA plumbing as Tessera's node plugin. It
//! runs inside the suite's process; [`StandInPlugins::stop`] (or dropping it) ends every plugin,
//! whose sockets are then removed and the kubelets deregister it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DraDriver, PluginConfig, PrepareResult, RegistrationState, UnprepareResult,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::local::LocalCluster;
use crate::wait::{Progress, until};

/// How long calls in flight may run once a stand-in plugin is told to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The claims one node's kubelet prepared and unprepared with the stand-in, by UID.
#[derive(Debug, Default)]
struct Calls {
    prepared: BTreeSet<String>,
    unprepared: BTreeSet<String>,
}

/// A driver with no devices: every claim is prepared with nothing for the container runtime.
struct NoDevices {
    calls: Arc<Mutex<Calls>>,
}

impl NoDevices {
    fn record(&self, claims: &[ClaimRef], prepared: bool) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        for claim in claims {
            let uid = claim.uid.as_str().to_owned();
            if prepared {
                calls.prepared.insert(uid);
            } else {
                calls.unprepared.insert(uid);
            }
        }
    }
}

impl DraDriver for NoDevices {
    type Error = String;

    async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult> {
        self.record(&claims, true);
        claims
            .into_iter()
            .map(|claim| (claim.uid, Ok(Vec::new())))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, UnprepareResult> {
        self.record(&claims, false);
        claims
            .into_iter()
            .map(|claim| (claim.uid, Ok(())))
            .collect()
    }
}

/// One node's running stand-in.
struct Running {
    node: String,
    calls: Arc<Mutex<Calls>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tessera_kubelet_grpc::ServeError>>>,
}

/// The stand-in plugin of one driver on every node of the local cluster.
pub struct StandInPlugins {
    driver: String,
    running: Vec<Running>,
}

impl StandInPlugins {
    /// Starts a stand-in for `driver` on every node of `local` and waits until each node's
    /// kubelet has registered it. A node whose kubelet directories the cluster's env file does
    /// not name is an error (an older tests/cluster).
    pub async fn start(
        driver: &str,
        local: &LocalCluster,
        timeout: Duration,
    ) -> anyhow::Result<StandInPlugins> {
        let mut plugins = StandInPlugins {
            driver: driver.to_owned(),
            running: Vec::new(),
        };
        for node in local.nodes.values() {
            let (Some(registrar), Some(plugins_dir)) = (&node.registrar_dir, &node.plugins_dir)
            else {
                bail!(
                    "the cluster's env file names no kubelet directories of {} \
                     (TESSERA_NODE_<i>_REGISTRAR_DIR, _PLUGINS_DIR): rebuild the cluster with tests/cluster/up",
                    node.name
                );
            };
            plugins
                .start_one(&node.name, registrar, plugins_dir, timeout)
                .await?;
        }
        Ok(plugins)
    }

    async fn start_one(
        &mut self,
        node: &str,
        registrar: &Path,
        plugins_dir: &Path,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let plugin = PluginConfig::new(&self.driver)
            .registrar_dir(registrar)
            .plugins_dir(plugins_dir)
            .shutdown_grace(SHUTDOWN_GRACE)
            .bind(Arc::new(NoDevices {
                calls: calls.clone(),
            }))
            .with_context(|| {
                format!("cannot bind the stand-in {} plugin on {node}", self.driver)
            })?;
        let mut state = plugin.registration_state();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(plugin.serve(async move {
            // A dropped sender stops the plugin too.
            let _ = stopped.await;
        }));
        self.running.push(Running {
            node: node.to_owned(),
            calls,
            stop: Some(stop),
            task: Some(task),
        });
        until(
            &format!(
                "the kubelet of {node} to register the stand-in {} plugin",
                self.driver
            ),
            timeout,
            || {
                let current = state.borrow_and_update().clone();
                async move {
                    Ok(match current {
                        RegistrationState::Registered => Progress::Done(()),
                        RegistrationState::Rejected { error } => {
                            bail!("the kubelet of {node} rejected the stand-in plugin: {error}")
                        }
                        RegistrationState::Pending => {
                            Progress::Waiting("no registration verdict yet".to_owned())
                        }
                    })
                }
            },
        )
        .await
    }

    /// The nodes the stand-in runs on.
    pub fn nodes(&self) -> Vec<String> {
        self.running.iter().map(|r| r.node.clone()).collect()
    }

    /// The UIDs of the claims `node`'s kubelet prepared (or, with `prepared` false, unprepared)
    /// with the stand-in.
    pub fn claims(&self, node: &str, prepared: bool) -> BTreeSet<String> {
        self.running
            .iter()
            .filter(|r| r.node == node)
            .flat_map(|r| {
                let calls = r.calls.lock().unwrap_or_else(|e| e.into_inner());
                if prepared {
                    calls.prepared.clone()
                } else {
                    calls.unprepared.clone()
                }
            })
            .collect()
    }

    /// Stops every plugin and waits until each has removed its sockets.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        for running in &mut self.running {
            if let Some(stop) = running.stop.take() {
                let _ = stop.send(());
            }
            if let Some(task) = running.task.take() {
                match task.await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => failures.push(format!("{}: {error}", running.node)),
                    Err(error) => failures.push(format!("{}: {error}", running.node)),
                }
            }
        }
        if !failures.is_empty() {
            bail!(
                "the stand-in {} plugin did not stop cleanly: {}",
                self.driver,
                failures.join("; ")
            );
        }
        Ok(())
    }
}

impl Drop for StandInPlugins {
    /// A scenario that failed before [`StandInPlugins::stop`]: the plugins are told to stop and
    /// finish on their own (the suite's runtime outlives the scenario).
    fn drop(&mut self) {
        for running in &mut self.running {
            if let Some(stop) = running.stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_stand_in_prepares_with_no_device_and_records_each_call() {
        let calls = Arc::new(Mutex::new(Calls::default()));
        let driver = NoDevices {
            calls: calls.clone(),
        };
        let claims = vec![
            ClaimRef::new("ns", "same-root", "uid-1"),
            ClaimRef::new("ns", "same-numa-node", "uid-2"),
        ];
        let prepared = driver.prepare(claims.clone()).await;
        assert_eq!(prepared.len(), 2);
        assert!(
            prepared
                .values()
                .all(|r| r.as_ref().is_ok_and(|devices| devices.is_empty()))
        );
        let unprepared = driver.unprepare(claims[..1].to_vec()).await;
        assert!(unprepared.values().all(Result::is_ok));
        let calls = calls.lock().unwrap();
        assert_eq!(
            calls.prepared,
            BTreeSet::from(["uid-1".to_owned(), "uid-2".to_owned()])
        );
        assert_eq!(calls.unprepared, BTreeSet::from(["uid-1".to_owned()]));
    }

    #[tokio::test]
    async fn a_kubelet_registers_it_calls_it_and_stopping_removes_its_sockets() {
        use tessera_kubelet_grpc::simulator::KubeletSimulator;

        const DRIVER: &str = "nic.example.com";
        let dir = tempfile::tempdir().unwrap();
        let registrar = dir.path().join("plugins_registry");
        let plugins_dir = dir.path().join("plugins");
        let paths = PluginConfig::new(DRIVER)
            .registrar_dir(&registrar)
            .plugins_dir(&plugins_dir)
            .socket_paths()
            .unwrap();
        // The kubelet's side: register the plugin once its socket is there.
        let kubelet = tokio::spawn({
            let socket = paths.registration.clone();
            async move {
                for _ in 0..500 {
                    if socket.exists() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                KubeletSimulator::register(&socket).await
            }
        });
        let mut plugins = StandInPlugins {
            driver: DRIVER.to_owned(),
            running: Vec::new(),
        };
        plugins
            .start_one("node-1", &registrar, &plugins_dir, Duration::from_secs(10))
            .await
            .unwrap();
        let kubelet = kubelet.await.unwrap().unwrap();
        assert_eq!(kubelet.info().name, DRIVER);
        assert_eq!(plugins.nodes(), ["node-1"]);

        let claim = ClaimRef::new("ns", "same-root", "uid-1");
        let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        assert!(
            prepared[&claim.uid].as_ref().is_ok_and(Vec::is_empty),
            "{prepared:?}"
        );
        assert_eq!(
            plugins.claims("node-1", true),
            BTreeSet::from(["uid-1".to_owned()])
        );
        assert!(plugins.claims("node-1", false).is_empty());
        assert!(plugins.claims("node-2", true).is_empty());
        let unprepared = kubelet
            .unprepare(std::slice::from_ref(&claim))
            .await
            .unwrap();
        assert!(unprepared[&claim.uid].is_ok());
        assert_eq!(
            plugins.claims("node-1", false),
            BTreeSet::from(["uid-1".to_owned()])
        );

        plugins.stop().await.unwrap();
        assert!(
            !paths.registration.exists(),
            "{}",
            paths.registration.display()
        );
        assert!(!paths.dra.exists(), "{}", paths.dra.display());
    }
}
