//! IMEX daemons in pods of their own (the chart's `kubeletPlugin.imex`), one per (domain, node),
//! like the MPS daemon pods ([`crate::mps_pods`]) and for the same reason: they outlive the
//! plugin's pod, so a plugin restart or rollout leaves the domains' daemons, and the jobs using
//! them, running.
//!
//! A domain is a claim of class `imex.gpu.tessera.dev` ([`tessera_prepare::imex`]). Preparing it
//! on a node ([`PodImexControl::start`]):
//! 1. the peers: the nodes of the claim's `reservedFor` pods that are bound, and this node; their
//!    addresses (the node annotation `gpu.tessera.dev/imex-address`, else the first `InternalIP`);
//! 2. the domain's directory `<state dir>/imex/<claim uid>`: `config.cfg` (this node's address,
//!    the nodes config and the command socket as a container sees them under `/etc/nvidia-imex`)
//!    and `nodes_config.cfg` (the peers);
//! 3. the pod `tessera-imex-<claim uid>-<node hash>` on this node (host network) running the driver root's
//!    `nvidia-imex`; a pod started with other peers is replaced;
//! 4. readiness: the plugin asks the daemon with the driver root's `nvidia-imex-ctl -q` on its
//!    command socket until it answers `READY`, within [`START_TIMEOUT`] (a failed start is undone within the kubelet's 45 s); a
//!    pod that cannot run (image, crash loop: for instance a host `nvidia-imex` holding the node)
//!    fails prepare early with why. The kubelet retries.
//!
//! A domain grows as its pods are bound one by one, so every node's daemon must learn of peers
//! that came later: [`PodImexControl::refresh`] (every few seconds) recomputes each daemon pod's
//! peers and, where they changed, rewrites the nodes config and replaces the pod. Stopping
//! (unprepare of the domain's last pod on this node) deletes the pod, waits for it to go and
//! removes the directory. The plugin keeps no state: pods are found by label, their claim by
//! annotation.

pub mod condition;
mod health;
mod pod;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tessera_kubelet_grpc::ClaimUid;
use tessera_prepare::imex::{
    COMMAND_SOCKET, CONFIG_FILE, ImexControl, ImexDomain, ImexError, NODES_FILE,
};

pub use health::{DomainConditions, WRITE_TIMEOUT};
pub use pod::*;

use condition::DaemonHealth;

/// How long a daemon may take to answer `READY` (the kubelet gives prepare 45 s).
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the check for a host `nvidia-imex` waits for its port to answer.
const HOST_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a deleted daemon pod may take to go.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(200);

/// [`ImexControl`] with daemons in pods.
#[derive(Clone)]
pub struct PodImexControl {
    client: kube::Client,
    pods: Api<Pod>,
    runtime: tokio::runtime::Handle,
    template: ImexPodTemplate,
    /// `<state dir>/imex`.
    imex_root: PathBuf,
    /// `nvidia-imex-ctl` as this process sees it, and the driver's libraries.
    ctl: PathBuf,
    library_path: String,
    /// Held by start, stop and refresh: a refresh never replaces a pod that a stop is deleting
    /// (which would leave a daemon no claim holds).
    serial: Arc<Mutex<()>>,
    /// This node's daemon health on the domains' claims.
    conditions: Arc<DomainConditions>,
    /// The IMEX peer port ([`SERVER_PORT`]; tests take another).
    server_port: u16,
}

impl PodImexControl {
    pub fn new(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        template: ImexPodTemplate,
        imex_root: PathBuf,
        ctl: PathBuf,
        library_path: String,
    ) -> Self {
        PodImexControl {
            pods: Api::namespaced(client.clone(), &template.namespace),
            conditions: Arc::new(DomainConditions::new(client.clone(), &template.node_name)),
            server_port: SERVER_PORT,
            client,
            runtime,
            template,
            imex_root,
            ctl,
            library_path,
            serial: Arc::default(),
        }
    }

    /// The same control with the IMEX peer port `port` (tests).
    pub fn with_server_port(mut self, port: u16) -> Self {
        self.server_port = port;
        self
    }

    fn serial(&self) -> MutexGuard<'_, ()> {
        self.serial.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address of node `name`.
    async fn address(&self, name: &str) -> Result<String, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let found = nodes
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .map_err(|e| format!("reading node {name}: {e}"))?;
        found.items.first().and_then(node_address).ok_or_else(|| {
            format!(
                "node {name} has no InternalIP (nor {})",
                tessera_api::imex::ADDRESS_ANNOTATION
            )
        })
    }

    /// The addresses of the domain's nodes: those of its bound pods, and this one.
    pub fn peers(&self, namespace: &str, name: &str) -> Result<BTreeSet<String>, String> {
        self.peers_of(&self.claim(namespace, name)?)
    }

    /// The domain's claim.
    fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        self.runtime
            .block_on(claims.get(name))
            .map_err(|e| format!("reading claim {namespace}/{name}: {e}"))
    }

    /// The addresses of the nodes of the claim's bound pods, and this one.
    fn peers_of(&self, claim: &ResourceClaim) -> Result<BTreeSet<String>, String> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        self.runtime.block_on(async {
            let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let mut pods = Vec::new();
            for pod in reserved_pods(claim) {
                match pods_api.get_opt(&pod).await {
                    Ok(Some(found)) => pods.push(found),
                    Ok(None) => {}
                    Err(e) => return Err(format!("reading pod {namespace}/{pod}: {e}")),
                }
            }
            let mut addresses = BTreeSet::new();
            for node in peer_nodes(&self.template.node_name, &pods) {
                addresses.insert(self.address(&node).await?);
            }
            Ok(addresses)
        })
    }

    /// Writes the domain's configuration and nodes config.
    fn write_config(&self, directory: &Path, peers: &BTreeSet<String>) -> Result<(), String> {
        let own = self
            .runtime
            .block_on(self.address(&self.template.node_name))?;
        let write = |file: &str, text: String| {
            let path = directory.join(file);
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        std::fs::create_dir_all(directory)
            .map_err(|e| format!("cannot create {}: {e}", directory.display()))?;
        write(NODES_FILE, nodes_text(peers))?;
        write(CONFIG_FILE, config_text(&own))
    }

    fn api_error(&self, claim_uid: &str, action: &str, e: kube::Error) -> String {
        let name = pod_name(claim_uid, &self.template.node_name);
        format!("{action} the IMEX daemon pod {name}: {e}")
    }

    /// Makes sure the domain's pod runs with `peers`: created, or replaced when it is finished,
    /// being deleted or started with other peers.
    fn ensure_pod(&self, domain: &ImexDomain, peers: &BTreeSet<String>) -> Result<(), String> {
        let name = pod_name(&domain.claim_uid, &self.template.node_name);
        let uid = &domain.claim_uid;
        self.runtime.block_on(async {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let existing = self
                    .pods
                    .get_opt(&name)
                    .await
                    .map_err(|e| self.api_error(uid, "reading", e))?;
                let Some(pod) = existing else {
                    let wanted = daemon_pod(&self.template, domain, peers);
                    match self.pods.create(&PostParams::default(), &wanted).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(self.api_error(uid, "creating", e)),
                    }
                };
                let deleting = pod.metadata.deletion_timestamp.is_some();
                let finished = matches!(
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                );
                if !deleting && !finished && pod_peers(&pod) == *peers {
                    return Ok(());
                }
                if !deleting {
                    self.delete_pod(uid).await?;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the old IMEX daemon pod {name} is still being deleted"
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        })
    }

    async fn delete_pod(&self, claim_uid: &str) -> Result<bool, String> {
        match self
            .pods
            .delete(
                &pod_name(claim_uid, &self.template.node_name),
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(self.api_error(claim_uid, "deleting", e)),
        }
    }

    /// What the domain's daemon answers to `nvidia-imex-ctl -q` (`READY`, `NOT_READY <why>`, …).
    pub fn query(&self, directory: &Path) -> Result<String, String> {
        let output = Command::new(&self.ctl)
            .arg("-u")
            .arg(directory.join(COMMAND_SOCKET))
            .arg("-q")
            .env("LD_LIBRARY_PATH", &self.library_path)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.ctl.display()))?;
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if output.status.success() {
            return Ok(answer);
        }
        let error = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        Err(if answer.is_empty() { error } else { answer })
    }

    /// Waits until the domain's daemon answers `READY`; fails early when its pod cannot run.
    fn wait_ready(&self, domain: &ImexDomain) -> Result<(), String> {
        let name = pod_name(&domain.claim_uid, &self.template.node_name);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut checked = Instant::now();
        loop {
            let last = match self.query(&domain.directory) {
                Ok(answer) if answer == "READY" => return Ok(()),
                Ok(answer) | Err(answer) => answer,
            };
            if checked.elapsed() > Duration::from_secs(1) {
                checked = Instant::now();
                let pod = self.runtime.block_on(self.pods.get_opt(&name));
                match pod.map_err(|e| self.api_error(&domain.claim_uid, "reading", e))? {
                    None => return Err(format!("the IMEX daemon pod {name} disappeared")),
                    Some(pod) => {
                        if let Some(reason) = broken(&pod) {
                            return Err(format!("the IMEX daemon pod {name} cannot run: {reason}"));
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the daemon of pod {name} is not ready after {START_TIMEOUT:?}: {last}"
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// This node's daemon pods.
    fn daemon_pods(&self) -> Result<Vec<Pod>, String> {
        let selector = format!(
            "app.kubernetes.io/component={COMPONENT},{NODE_LABEL}={}",
            self.template.node_name
        );
        self.runtime
            .block_on(self.pods.list(&ListParams::default().labels(&selector)))
            .map(|list| list.items)
            .map_err(|e| format!("listing the IMEX daemon pods ({selector}): {e}"))
    }

    /// The domain a daemon pod serves, from its label and annotation.
    fn domain_of(&self, pod: &Pod) -> Option<ImexDomain> {
        let uid = pod.metadata.labels.as_ref()?.get(DOMAIN_LABEL)?.clone();
        let claim = pod.metadata.annotations.as_ref()?.get(CLAIM_ANNOTATION)?;
        let (namespace, name) = claim.split_once('/')?;
        Some(ImexDomain {
            directory: tessera_prepare::paths::child(&self.imex_root, &uid).ok()?,
            claim_uid: uid,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            channel: 0,
            clique: String::new(),
        })
    }

    /// Restarts, with their new peers, the daemons whose domain grew or shrank; returns the
    /// domains restarted. A failure is logged and retried at the next refresh.
    pub fn refresh(&self) -> Vec<String> {
        let _serial = self.serial();
        let pods = match self.daemon_pods() {
            Ok(pods) => pods,
            Err(e) => {
                tracing::warn!(error = %e, "cannot refresh the IMEX daemons' peers");
                return Vec::new();
            }
        };
        let mut restarted = Vec::new();
        for pod in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let Some(domain) = self.domain_of(pod) else {
                continue;
            };
            match self.refresh_one(pod, &domain) {
                Ok(true) => {
                    tracing::info!(claim = %domain.claim(), "IMEX domain changed: daemon restarted with its new peers");
                    restarted.push(domain.claim_uid);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(claim = %domain.claim(), error = %e, "cannot refresh an IMEX daemon's peers")
                }
            }
        }
        restarted
    }

    /// Restarts one daemon pod whose domain's peers changed (true), or else, once it has had
    /// [`START_TIMEOUT`] to start, reports whether its daemon answers `READY`.
    fn refresh_one(&self, pod: &Pod, domain: &ImexDomain) -> Result<bool, String> {
        let claim = self.claim(&domain.namespace, &domain.name)?;
        let peers = self.peers_of(&claim)?;
        if peers != pod_peers(pod) {
            self.write_config(&domain.directory, &peers)?;
            return self.ensure_pod(domain, &peers).map(|()| true);
        }
        let started = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let settled = started.is_some_and(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t)
                .as_secs()
                >= START_TIMEOUT.as_secs() as i64
        });
        if settled {
            let health = match self.query(&domain.directory) {
                Ok(answer) if answer == "READY" => DaemonHealth::Ready,
                Ok(answer) | Err(answer) => DaemonHealth::NotReady(answer),
            };
            self.report(&claim, &health);
        }
        Ok(false)
    }

    /// Fails when something other than a daemon pod of ours holds this node's IMEX port: a host
    /// `nvidia-imex` service (the driver's package installs one). The driver admits one IMEX
    /// daemon per node, so ours would only crash-loop against it; the plugin reports it and
    /// starts none. Checked only while no daemon pod of ours is on the node (one of ours holds the
    /// port itself): a TCP connection to this node's IMEX address and port that is accepted.
    fn no_host_daemon(&self) -> Result<(), String> {
        if !self.daemon_pods()?.is_empty() {
            return Ok(());
        }
        let own = self
            .runtime
            .block_on(self.address(&self.template.node_name))?;
        let Ok(ip) = own.parse::<std::net::IpAddr>() else {
            return Ok(());
        };
        let target = std::net::SocketAddr::new(ip, self.server_port);
        if std::net::TcpStream::connect_timeout(&target, HOST_PROBE_TIMEOUT).is_err() {
            return Ok(());
        }
        let reason = host_daemon_reason(&self.template.node_name, &target);
        tracing::warn!(node = %self.template.node_name, address = %target, "{reason}");
        Err(reason)
    }

    /// Writes this node's daemon health on the claim; a failure is logged (the next report
    /// writes it again).
    fn report(&self, claim: &ResourceClaim, health: &DaemonHealth) {
        if let Err(e) = self.runtime.block_on(self.conditions.report(claim, health)) {
            tracing::warn!(error = %e, "cannot report an IMEX daemon's health");
        }
    }

    /// Calls [`Self::refresh`] every `interval` until `stop` completes.
    pub async fn refresh_until(self, interval: Duration, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(interval) => {}
            }
            let control = self.clone();
            let _ = tokio::task::spawn_blocking(move || control.refresh()).await;
        }
    }
}

impl ImexControl for PodImexControl {
    fn start(&self, domain: &ImexDomain) -> Result<(), ImexError> {
        let failed = |reason: String| ImexError::Start {
            claim: domain.claim(),
            channel: domain.channel,
            reason,
        };
        let _serial = self.serial();
        let claim = self
            .claim(&domain.namespace, &domain.name)
            .map_err(failed)?;
        let started = self.peers_of(&claim).and_then(|peers| {
            self.no_host_daemon()?;
            self.write_config(&domain.directory, &peers)?;
            self.ensure_pod(domain, &peers)?;
            self.wait_ready(domain)
        });
        let health = match &started {
            Ok(()) => DaemonHealth::Ready,
            Err(reason) => DaemonHealth::NotReady(reason.clone()),
        };
        self.report(&claim, &health);
        started.map_err(failed)
    }

    fn stop(&self, claim_uid: &str, directory: &Path) -> Result<(), ImexError> {
        let failed = |reason: String| ImexError::Stop {
            claim_uid: claim_uid.to_owned(),
            reason,
        };
        let name = pod_name(claim_uid, &self.template.node_name);
        let _serial = self.serial();
        let claim = self
            .runtime
            .block_on(self.pods.get_opt(&name))
            .ok()
            .flatten()
            .and_then(|pod| self.domain_of(&pod));
        self.runtime
            .block_on(async {
                let deadline = Instant::now() + STOP_TIMEOUT;
                self.delete_pod(claim_uid).await?;
                while self
                    .pods
                    .get_opt(&name)
                    .await
                    .map_err(|e| self.api_error(claim_uid, "reading", e))?
                    .is_some()
                {
                    if Instant::now() > deadline {
                        return Err(format!(
                            "the IMEX daemon pod {name} is still there after {STOP_TIMEOUT:?}"
                        ));
                    }
                    tokio::time::sleep(POLL).await;
                }
                Ok(())
            })
            .map_err(failed)?;
        if let Some(domain) = claim {
            let forget = self
                .conditions
                .forget(&domain.namespace, &domain.name, claim_uid);
            if let Err(e) = self.runtime.block_on(forget) {
                tracing::warn!(claim = %domain.claim(), error = %e, "cannot take this node's IMEX daemon condition back");
            }
        }
        match std::fs::remove_dir_all(directory) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed(format!(
                "cannot remove {}: {e}",
                directory.display()
            ))),
        }
    }

    fn domains(&self) -> Result<Vec<ClaimUid>, ImexError> {
        let pods = self.daemon_pods().map_err(ImexError::List)?;
        Ok(pods
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(DOMAIN_LABEL))
            .map(ClaimUid::new)
            .collect())
    }
}
