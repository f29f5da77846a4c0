//! Processing one pod: decide, then do. The caches are handed to
//! [`tessera_placement::decide::decide`] as its [`ClusterSource`], which returns the pod's (or its
//! group's) [`Decision`]; [`crate::execute`] carries it out. The only place decisions meet IO.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::Timestamp;
use tessera_allocator::DeviceId;
use tessera_placement::decide::{decide, pod_group_needed};
use tessera_placement::decision::{ClusterSource, Decision, PodVerdict, PreemptionObjects, Ruling};
use tessera_placement::group::membership::GroupKey;
use tessera_placement::group::membership::group_key;
use tessera_placement::planner::Action;
use tessera_placement::preemption::nomination::{Nominations, with_reserved};
use tessera_placement::preemption::{PreemptionSettings, pod_priority};
use tessera_placement::view::{PodContext, Settings};

use crate::api::ApiWriter;
use crate::cluster::{Cluster, InventorySnapshot};
use crate::events::Events;
use crate::execute::{Execution, Targets, write_failed};
use crate::metrics::Metrics;
use crate::queue::Processed;
use crate::refusals::RefusedEvictions;
use crate::timing;
use crate::waiting::WaitingGroups;

/// Processes pods, one at a time.
pub struct Worker {
    pub cluster: Arc<Cluster>,
    pub writer: ApiWriter,
    /// Where the worker's events go to be published off its path ([`crate::events`]).
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub config: Settings,
    /// Groups waiting for capacity (the starvation policy's memory).
    pub waiting: WaitingGroups,
    /// Evictions refused recently (left out of preemption searches a while).
    pub refused: RefusedEvictions,
    /// Whether pods preempt (`--preemption`); off, they still go by priority.
    pub preemption: bool,
}

impl Worker {
    /// Processes the pod `namespace/name`.
    pub async fn process(&self, key: &str) -> Processed {
        timing::at(key, "popped");
        let processed = self.process_pod(key).await;
        tracing::debug!(target: timing::TARGET, pod = key, step = "done",
            outcome = ?processed, unix_us = timing::unix_micros());
        processed
    }

    async fn process_pod(&self, key: &str) -> Processed {
        let started = Instant::now();
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let Some(pod) = self.cluster.pod(namespace, name) else {
            return Processed::Done;
        };
        let pod_group = match self.read_pod_group(&pod).await {
            Ok(pod_group) => pod_group,
            Err(processed) => return processed,
        };
        self.decide_and_do(pod, pod_group, key, started).await
    }

    /// The PodGroup the decision for `pod` reads, from the API server (PodGroups are not
    /// watched): its key, and the PodGroup if it exists; `Err` when reading it failed.
    async fn read_pod_group(&self, pod: &Pod) -> Result<Option<ReadPodGroup>, Processed> {
        let Some(key) = pod_group_needed(pod, &self.config) else {
            return Ok(None);
        };
        match self.writer.get_pod_group(&key.namespace, &key.name).await {
            Ok(found) => Ok(Some((key, found))),
            Err(e) => Err(write_failed(&self.metrics, pod, e)),
        }
    }

    /// Decides for `pod` (named `key`) and carries the decision out.
    async fn decide_and_do(
        &self,
        pod: Arc<Pod>,
        pod_group: Option<ReadPodGroup>,
        key: &str,
        started: Instant,
    ) -> Processed {
        let caches = Caches {
            cluster: &self.cluster,
            metrics: &self.metrics,
            pod_group,
            pod: &pod,
            gate: &self.config.gate,
            refused: &self.refused,
            preemption: self.preemption,
            inventory: OnceLock::new(),
        };
        let waiting = self.waiting.all();
        let decision = decide(&pod, &caches, &waiting, &self.config, Timestamp::now());
        if decision.ruling.planned() {
            self.metrics
                .decision_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        if planned_alone(&decision) {
            timing::at(key, "decided");
        }
        let targets = Targets {
            cluster: &self.cluster,
            writer: &self.writer,
            events: &self.events,
            metrics: &self.metrics,
            waiting: &self.waiting,
            refused: &self.refused,
        };
        Execution::new(targets, started).run(decision).await
    }
}

/// Whether the planner placed, released or gave up on a pod alone (not a released pod looked at
/// again, whose claims are all allocated): the `decided` step of the timing events.
fn planned_alone(decision: &Decision) -> bool {
    matches!(&decision.ruling,
        Ruling::Pod(PodVerdict::Decided(plan)) if plan.action != Action::Nothing)
}

/// A PodGroup read from the API server: its key, and the PodGroup when it exists.
type ReadPodGroup = (GroupKey, Option<PodGroup>);

/// The caches as a decision reads them, with the PodGroup read for it.
struct Caches<'a> {
    cluster: &'a Cluster,
    metrics: &'a Metrics,
    pod_group: Option<ReadPodGroup>,
    /// The pod decided for: devices nominated for others are in use for it.
    pod: &'a Arc<Pod>,
    gate: &'a str,
    refused: &'a RefusedEvictions,
    /// Whether the decision may preempt.
    preemption: bool,
    /// The inventory of this decision, taken at its first use: every read of one decision (the
    /// contexts, the victim index whose node indices point into it) sees the same one.
    inventory: OnceLock<Arc<InventorySnapshot>>,
}

impl Caches<'_> {
    fn inventory(&self) -> &Arc<InventorySnapshot> {
        self.inventory.get_or_init(|| {
            self.cluster.inventory(|| {
                self.metrics.inventory_rebuilds.inc();
            })
        })
    }

    /// The devices nominated for other pods that the pod decided for (with its gang) may not
    /// take ([`Nominations::reserved_against`]).
    fn reserved(&self) -> Vec<DeviceId> {
        let pods = self.cluster.nominated_pods();
        let nominations =
            Nominations::from_pods(pods.iter().map(AsRef::as_ref), self.gate, Timestamp::now());
        if nominations.standing().next().is_none() {
            return Vec::new();
        }
        let group = group_key(self.pod);
        let mut except = vec![self.pod.metadata.uid.as_deref().unwrap_or_default()];
        let members = group
            .as_ref()
            .map(|key| self.cluster.group_pods(key))
            .unwrap_or_default();
        except.extend(members.iter().filter_map(|p| p.metadata.uid.as_deref()));
        nominations.reserved_against(pod_priority(self.pod), &except, group.as_ref())
    }
}

impl ClusterSource for Caches<'_> {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        self.cluster.claim(namespace, name)
    }

    fn template_exists(&self, namespace: &str, name: &str) -> bool {
        self.cluster.template_exists(namespace, name)
    }

    fn group_pods(&self, key: &GroupKey) -> Vec<Arc<Pod>> {
        self.cluster.group_pods(key)
    }

    fn pod_group(&self, key: &GroupKey) -> Option<&PodGroup> {
        self.pod_group
            .as_ref()
            .filter(|(read, _)| read == key)
            .and_then(|(_, found)| found.as_ref())
    }

    fn with_context(&self, except: &str, decide: &mut dyn FnMut(&PodContext<'_>)) {
        let snapshot = self.inventory();
        let in_use = self.cluster.devices_in_use();
        let reserved = self.reserved();
        let in_use = with_reserved(&in_use, &reserved);
        let usage: Arc<HashMap<_, _>> = self.cluster.node_usage(except);
        let unmanaged = || snapshot.unmanaged();
        decide(&PodContext {
            devices: &snapshot.devices,
            unmanaged: &unmanaged,
            in_use: &in_use,
            usage: &usage,
        });
    }

    fn channel_holders(&self, clique: &str) -> Vec<String> {
        let claims = self.cluster.claims();
        tessera_placement::imex::holders(claims.iter().map(|c| &**c), clique)
    }

    fn domain_nodes(&self) -> tessera_placement::imex::DomainNodes {
        let pods = self.cluster.pods();
        tessera_placement::imex::DomainNodes::of(pods.iter().map(AsRef::as_ref), |ns, name| {
            self.cluster.claim(ns, name)
        })
    }

    fn preemption(&self) -> Option<PreemptionObjects> {
        if !self.preemption {
            return None;
        }
        let budgets = self.cluster.budgets();
        let victims = self.cluster.victims(
            self.inventory(),
            &budgets,
            self.gate,
            Timestamp::now(),
            || {
                tracing::debug!("victim index built again: pods, claims or budgets changed");
            },
        );
        Some(PreemptionObjects {
            pods: self.cluster.pods(),
            claims: self.cluster.claims(),
            budgets,
            refused: self.refused.recent(),
            settings: PreemptionSettings::default(),
            victims: Some(victims),
        })
    }
}
