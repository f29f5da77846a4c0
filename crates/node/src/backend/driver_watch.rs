//! The NVIDIA driver under the driver root, watched while the plugin runs.
//!
//! The GPU operator upgrades the driver in place under `/run/nvidia/driver` (k8s-driver-manager
//! drains the node, replaces the driver container, and the new one lays its files under the same
//! root); a host package upgrade does the same under `/`. Claim specs name the driver's files by
//! version (`libcuda.so.<version>`), so specs written after the upgrade must name the new files.
//! Every [`DriverWatch::interval`] the watch reads the candidate roots
//! ([`DriverRoots::first_complete`], [`tessera_driver_root::discover`]) and:
//!
//! - a candidate preferred to the one in use holds a complete driver (the GPU operator was
//!   installed after the plugin started on the host's driver): moves to it, as below;
//! - same version under the root in use: nothing;
//! - no complete driver there (the upgrade is laying files, or the root was emptied): the claim
//!   specs keep the last driver's files, the watch says so once, and looks again; it does not
//!   move to a less preferred root (mid-upgrade, the operator's root is briefly incomplete);
//! - another version: reads the root again as at start ([`driver_root::load`]) and replaces the
//!   injection ([`CurrentInjection`]) every claim spec prepared afterwards is built with; logs
//!   the change, counts it (`tessera_node_driver_reloads{change,result}`) and records an Event
//!   on the Node ([`driver_event`]). Claims already prepared keep their specs (their containers
//!   run with the files they were started with; a plugin restart rewrites them).
//!
//! What it does not follow: the NVML handle the backend opened at start and the driver's tools
//! used for time-slicing and MPS (paths of the old version and root); docs/operations.md,
//! "Driver upgrades", says to restart the plugin after an upgrade for those.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tessera_prepare::injection::CurrentInjection;
use tessera_process::Stop;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::driver_root::{self, CompleteRoot, DriverRoots};
use crate::metrics::{DriverChange, NodeMetrics, ResultLabel};
use crate::publish::node::WatchedNode;

/// How often the driver root is read by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// The Node Event reason of a new driver version read under the root in use.
pub const DRIVER_RELOADED_REASON: &str = "DriverReloaded";
/// The Node Event reason of a move to another driver root.
pub const DRIVER_ROOT_CHANGED_REASON: &str = "DriverRootChanged";
/// The Node Event reason of a changed driver that cannot be read.
pub const DRIVER_RELOAD_FAILED_REASON: &str = "DriverReloadFailed";

/// A driver: the root (host path) it is under and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverAt {
    pub root: PathBuf,
    pub version: String,
}

/// What one look at the driver roots found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverCheck {
    /// The driver the specs inject is there, and no preferred root has one.
    Unchanged,
    /// No complete driver under the root in use (what it lacks); the specs keep the last one's
    /// files.
    Incomplete(String),
    /// Another driver, read: specs prepared from now on inject its files.
    Changed {
        change: DriverChange,
        from: DriverAt,
        to: DriverAt,
    },
    /// Another driver, which could not be read (the specs keep the last driver's files).
    ReloadFailed {
        change: DriverChange,
        from: DriverAt,
        to: DriverAt,
        error: String,
    },
}

/// Watches the driver roots and keeps [`CurrentInjection`] on the driver of the one in use.
pub struct DriverWatch {
    pub roots: DriverRoots,
    /// The candidate (index in [`DriverRoots::candidates`]) the injection comes from.
    pub chosen: usize,
    /// The version the injection holds now.
    pub version: String,
    pub injection: CurrentInjection,
    pub metrics: NodeMetrics,
    pub interval: Duration,
    /// Whether the last look found no complete driver (said once, until one is there again).
    incomplete: bool,
}

impl DriverWatch {
    /// Watches `roots`, whose candidate `chosen` holds driver `version` (in `injection`).
    pub fn new(
        roots: DriverRoots,
        chosen: CompleteRoot,
        injection: CurrentInjection,
        metrics: NodeMetrics,
    ) -> DriverWatch {
        DriverWatch {
            roots,
            chosen: chosen.index,
            version: chosen.version,
            injection,
            metrics,
            interval: DEFAULT_INTERVAL,
            incomplete: false,
        }
    }

    /// The driver the injection holds.
    pub fn current(&self) -> DriverAt {
        DriverAt {
            root: self.roots.candidates[self.chosen].host.clone(),
            version: self.version.clone(),
        }
    }

    /// Reads the roots once and follows a new driver (blocking: file IO).
    pub fn check(&mut self) -> DriverCheck {
        if let Ok(preferred) = self.roots.first_complete(self.chosen) {
            return self.reload(preferred, DriverChange::Root);
        }
        let found = match driver_root::version_at(&self.roots.candidates[self.chosen]) {
            Ok(version) => version,
            Err(lacks) => return DriverCheck::Incomplete(lacks),
        };
        if found == self.version {
            return DriverCheck::Unchanged;
        }
        let found = CompleteRoot {
            index: self.chosen,
            version: found,
        };
        self.reload(found, DriverChange::Version)
    }

    /// Reads candidate `found` as at start and, if it reads, injects its driver from now on.
    fn reload(&mut self, found: CompleteRoot, change: DriverChange) -> DriverCheck {
        let from = self.current();
        let mut to = DriverAt {
            root: self.roots.candidates[found.index].host.clone(),
            version: found.version,
        };
        match driver_root::load(&self.roots.config(found.index)) {
            Ok((injection, _tools, summary)) => {
                self.injection.replace(injection);
                self.chosen = found.index;
                self.version = summary.version.clone();
                self.metrics.driver_reload(change, ResultLabel::Success);
                to.version = summary.version;
                DriverCheck::Changed { change, from, to }
            }
            Err(error) => {
                // Keep the old injection; try again at the next look.
                self.metrics.driver_reload(change, ResultLabel::Error);
                DriverCheck::ReloadFailed {
                    change,
                    from,
                    to,
                    error: error.to_string(),
                }
            }
        }
    }

    /// Logs what [`DriverWatch::check`] found (an incomplete root once until it is whole again).
    fn report(&mut self, check: &DriverCheck) {
        let root = self.current().root.display().to_string();
        match check {
            DriverCheck::Unchanged => self.incomplete = false,
            DriverCheck::Incomplete(lacks) => {
                if !std::mem::replace(&mut self.incomplete, true) {
                    tracing::warn!(driver_root = %root, version = %self.version, lacks = %lacks, "the driver root holds no complete NVIDIA driver now (an upgrade in progress?); claim specs keep the last driver's files");
                }
            }
            DriverCheck::Changed { from, to, .. } => {
                self.incomplete = false;
                tracing::info!(from_root = %from.root.display(), to_root = %to.root.display(), from = %from.version, to = %to.version, "{}; claims prepared from now on get the new driver's files (restart the plugin for MPS/time-slicing tools and NVML)", headline(check));
            }
            DriverCheck::ReloadFailed {
                from, to, error, ..
            } => {
                tracing::warn!(from_root = %from.root.display(), to_root = %to.root.display(), from = %from.version, to = %to.version, %error, "{} but cannot be read; claim specs keep the last driver's files", headline(check));
            }
        }
    }

    /// Looks every [`DriverWatch::interval`] until `stop`, recording an Event on the Node for
    /// each change (`events`: none in tests without an API server).
    pub fn spawn(self, events: Option<NodeDriverEvents>, stop: Stop) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut watch = self;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(watch.interval) => {}
                    _ = stop.cancelled() => return,
                }
                let looked = tokio::task::spawn_blocking(move || {
                    let check = watch.check();
                    (watch, check)
                })
                .await;
                let Ok((returned, check)) = looked else {
                    tracing::error!("the driver root watch panicked");
                    return;
                };
                watch = returned;
                watch.report(&check);
                if let (Some(events), Some(event)) = (&events, driver_event(&check)) {
                    events.record(event).await;
                }
            }
        })
    }
}

/// What the log and the Event say first about a change.
fn headline(check: &DriverCheck) -> &'static str {
    match check {
        DriverCheck::Changed {
            change: DriverChange::Root,
            ..
        }
        | DriverCheck::ReloadFailed {
            change: DriverChange::Root,
            ..
        } => "a preferred driver root now holds a complete NVIDIA driver",
        _ => "NVIDIA driver changed under the driver root",
    }
}

/// The Event on the Node that says what a look at the driver roots changed; `None` when
/// nothing changed.
pub fn driver_event(check: &DriverCheck) -> Option<Event> {
    let (type_, reason, note) = match check {
        DriverCheck::Unchanged | DriverCheck::Incomplete(_) => return None,
        DriverCheck::Changed { change, from, to } => (
            EventType::Normal,
            match change {
                DriverChange::Version => DRIVER_RELOADED_REASON,
                DriverChange::Root => DRIVER_ROOT_CHANGED_REASON,
            },
            format!(
                "{}: driver {} under {} -> driver {} under {}; claims prepared from now on get \
                 its files (restart the plugin for NVML and the MPS/time-slicing tools)",
                headline(check),
                from.version,
                from.root.display(),
                to.version,
                to.root.display()
            ),
        ),
        DriverCheck::ReloadFailed {
            from, to, error, ..
        } => (
            EventType::Warning,
            DRIVER_RELOAD_FAILED_REASON,
            format!(
                "{}: driver {} under {} cannot be read ({error}); claims keep driver {} under {}",
                headline(check),
                to.version,
                to.root.display(),
                from.version,
                from.root.display()
            ),
        ),
    };
    Some(Event {
        type_,
        reason: reason.into(),
        note: Some(crate::claims::truncate(&note, 1024)),
        action: "ReadDriverRoot".into(),
        secondary: None,
    })
}

/// Events on this node's Node object through the API server (`events.k8s.io/v1`).
pub struct NodeDriverEvents {
    recorder: Recorder,
    node_name: String,
    /// The Node's uid once the Node watch has seen it.
    node: watch::Receiver<Option<WatchedNode>>,
}

impl NodeDriverEvents {
    /// Records as `tessera-kubelet-plugin`, instance `node_name`, on the Node `node_name`.
    pub fn new(
        client: kube::Client,
        node_name: &str,
        node: watch::Receiver<Option<WatchedNode>>,
    ) -> NodeDriverEvents {
        NodeDriverEvents {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "tessera-kubelet-plugin".into(),
                    instance: Some(node_name.to_owned()),
                },
            ),
            node_name: node_name.to_owned(),
            node,
        }
    }

    async fn record(&self, event: Event) {
        // Without the Node's uid yet, the node's name: the kubelet's own Node events do that,
        // and `kubectl describe node` shows both.
        let uid = self.node.borrow().as_ref().map(|node| node.uid.clone());
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node_name.clone()),
            uid: Some(uid.unwrap_or_else(|| self.node_name.clone())),
            ..ObjectReference::default()
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason = %event.reason, "cannot record the driver change as an Event on the Node");
        }
    }
}

#[cfg(test)]
mod tests;
