//! What health monitoring has found so far, and what it means for each published device:
//! its taints and its health on the kubelet stream. Pure.
//!
//! An event without GPU/compute-instance ids concerns the whole GPU: every device of the GPU
//! (the GPU itself and all its MIG devices) gets the finding. An event with instance ids
//! concerns that MIG device only. For one device, one taint per key: the strongest effect wins.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tessera_gpu_inventory::{GpuInventory, ResolvedDevice};
use tessera_kubelet_grpc::{DeviceHealth, HealthStatus};
use tessera_nvml::HealthEvent;

use super::policy::{HealthFinding, TaintEffect, classify};

/// The fabric findings of the GPUs of the last rescan, each since the first rescan that read it
/// (so a finding that holds keeps its time, and the published taint does not change).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricStates {
    findings: BTreeMap<String, (HealthFinding, SystemTime)>,
}

impl FabricStates {
    /// Takes the fabric state of every GPU of `inventory` as read at `now`.
    pub fn observe(&mut self, inventory: &GpuInventory, now: SystemTime) {
        let mut next = BTreeMap::new();
        for gpu in &inventory.gpus {
            let Some(finding) = gpu.fabric.as_ref().and_then(super::policy::fabric) else {
                continue;
            };
            let since = match self.findings.get(&gpu.uuid) {
                Some((known, since)) if *known == finding => *since,
                _ => {
                    tracing::warn!(gpu = %gpu.uuid, finding = %finding.message, "the GPU cannot use its NVLink fabric: tainted until a rescan reads it usable");
                    now
                }
            };
            next.insert(gpu.uuid.clone(), (finding, since));
        }
        for uuid in self.findings.keys().filter(|u| !next.contains_key(*u)) {
            tracing::info!(gpu = %uuid, "the GPU's NVLink fabric is usable again: its fabric taint goes");
        }
        self.findings = next;
    }
}

/// What a finding is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HealthScope {
    /// A whole GPU, by UUID.
    Gpu { uuid: String },
    /// One MIG device of a GPU, by GPU-instance (and compute-instance) id.
    MigInstance {
        gpu_uuid: String,
        gpu_instance_id: u32,
        compute_instance_id: Option<u32>,
    },
}

impl HealthScope {
    /// The scope an NVML event is about.
    pub fn of(event: &HealthEvent) -> Self {
        match event.gpu_instance_id {
            Some(gpu_instance_id) => HealthScope::MigInstance {
                gpu_uuid: event.gpu_uuid.clone(),
                gpu_instance_id,
                compute_instance_id: event.compute_instance_id,
            },
            None => HealthScope::Gpu {
                uuid: event.gpu_uuid.clone(),
            },
        }
    }
}

/// A finding with the time it was first made and the time an event last confirmed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatedFinding {
    pub finding: HealthFinding,
    pub since: SystemTime,
    /// The last event that made or repeated the finding (a weaker one on the same key too).
    pub last_seen: SystemTime,
}

/// Every finding so far, by scope and taint key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthFindings {
    findings: BTreeMap<HealthScope, BTreeMap<&'static str, DatedFinding>>,
}

impl HealthFindings {
    /// Records what `event` means, at `now`. Returns the finding when it changed what is known
    /// (a new key, a new value, or a stronger effect); `None` for events the policy ignores and
    /// for repeats.
    pub fn record(&mut self, event: &HealthEvent, now: SystemTime) -> Option<HealthFinding> {
        let finding = classify(event.kind)?;
        let by_key = self.findings.entry(HealthScope::of(event)).or_default();
        match by_key.get_mut(finding.key) {
            Some(known) if known.finding.effect > finding.effect => {
                known.last_seen = now;
                None
            }
            Some(known) if known.finding == finding => {
                known.last_seen = now;
                None
            }
            Some(known) => {
                known.finding = finding.clone();
                known.last_seen = now;
                Some(finding)
            }
            None => {
                by_key.insert(
                    finding.key,
                    DatedFinding {
                        finding: finding.clone(),
                        since: now,
                        last_seen: now,
                    },
                );
                Some(finding)
            }
        }
    }

    /// Forgets the findings no event has confirmed for `healthy_for` (as of `now`): their
    /// devices have been healthy that long, so their taints go. Returns what was forgotten.
    pub fn clear_healed(&mut self, now: SystemTime, healthy_for: Duration) -> Vec<DatedFinding> {
        let healed = |dated: &DatedFinding| {
            now.duration_since(dated.last_seen)
                .is_ok_and(|quiet| quiet >= healthy_for)
        };
        let mut cleared = Vec::new();
        for by_key in self.findings.values_mut() {
            let keys: Vec<&'static str> = by_key
                .iter()
                .filter(|(_, dated)| healed(dated))
                .map(|(key, _)| *key)
                .collect();
            for key in keys {
                cleared.extend(by_key.remove(key));
            }
        }
        self.findings.retain(|_, by_key| !by_key.is_empty());
        cleared
    }

    /// Records that the GPU `gpu_uuid` is unreachable since `since` ([`super::unreachable`]):
    /// a whole-GPU finding, so it reaches the GPU's MIG devices too. Not kept by the monitor's
    /// shared findings: the publisher adds it to each snapshot while rescans find the GPU lost.
    pub fn record_unreachable(&mut self, gpu_uuid: &str, since: SystemTime) {
        let finding = super::unreachable();
        self.findings
            .entry(HealthScope::Gpu {
                uuid: gpu_uuid.to_owned(),
            })
            .or_default()
            .insert(
                finding.key,
                DatedFinding {
                    finding,
                    since,
                    last_seen: since,
                },
            );
    }

    /// Records what each GPU's fabric state means ([`super::policy::fabric`]), since when `since`
    /// says (the first rescan that read that state: [`FabricStates`]).
    pub fn record_fabric(&mut self, fabric: &FabricStates) {
        for (uuid, (finding, since)) in &fabric.findings {
            self.findings
                .entry(HealthScope::Gpu { uuid: uuid.clone() })
                .or_default()
                .insert(
                    finding.key,
                    DatedFinding {
                        finding: finding.clone(),
                        since: *since,
                        last_seen: *since,
                    },
                );
        }
    }

    /// Records the unreachable finding of every lost GPU the inventory keeps (UUID, and when a
    /// rescan first found it lost).
    pub fn record_lost(&mut self, lost: impl IntoIterator<Item = (String, SystemTime)>) {
        for (uuid, since) in lost {
            self.record_unreachable(&uuid, since);
        }
    }

    /// Whether nothing has been found.
    pub fn is_empty(&self) -> bool {
        self.findings.is_empty()
    }

    /// The findings that apply to the published device `name`, one per taint key (strongest
    /// effect first found), ordered by key.
    pub fn for_device(&self, inventory: &GpuInventory, name: &str) -> Vec<&DatedFinding> {
        let mut scopes = Vec::new();
        match inventory.resolve_device(name) {
            Some(ResolvedDevice::Gpu(gpu)) => scopes.push((gpu.uuid.as_str(), None)),
            Some(ResolvedDevice::Mig { gpu, instance, .. }) => {
                scopes.push((gpu.uuid.as_str(), None));
                if let Some(instance) = instance {
                    scopes.push((
                        gpu.uuid.as_str(),
                        Some((instance.gpu_instance_id, instance.compute_instance_id)),
                    ));
                }
            }
            None => {}
        }
        let mut by_key: BTreeMap<&'static str, &DatedFinding> = BTreeMap::new();
        for (scope, by_scope_key) in &self.findings {
            let applies = scopes.iter().any(|(uuid, ids)| match (scope, ids) {
                (HealthScope::Gpu { uuid: u }, _) => u == uuid,
                (
                    HealthScope::MigInstance {
                        gpu_uuid,
                        gpu_instance_id,
                        compute_instance_id,
                    },
                    Some((gi, ci)),
                ) => {
                    gpu_uuid == uuid
                        && gpu_instance_id == gi
                        && compute_instance_id.is_none_or(|c| c == *ci)
                }
                (HealthScope::MigInstance { .. }, None) => false,
            });
            if !applies {
                continue;
            }
            for (key, dated) in by_scope_key {
                let stronger = by_key
                    .get(key)
                    .is_none_or(|known| dated.finding.effect > known.finding.effect);
                if stronger {
                    by_key.insert(key, dated);
                }
            }
        }
        by_key.into_values().collect()
    }

    /// The taints health monitoring puts on each of `devices` (devices without findings are
    /// left out).
    pub fn device_taints<'a>(
        &self,
        inventory: &GpuInventory,
        devices: impl IntoIterator<Item = &'a str>,
    ) -> BTreeMap<String, Vec<DeviceTaint>> {
        devices
            .into_iter()
            .filter_map(|name| {
                let taints: Vec<DeviceTaint> = self
                    .for_device(inventory, name)
                    .into_iter()
                    .map(|dated| DeviceTaint {
                        key: dated.finding.key.to_owned(),
                        value: Some(dated.finding.value.clone()),
                        effect: dated.finding.effect.as_str().to_owned(),
                        time_added: Some(Time(timestamp(dated.since))),
                    })
                    .collect();
                (!taints.is_empty()).then(|| (name.to_owned(), taints))
            })
            .collect()
    }

    /// The kubelet health stream's view of `devices` in `pool`: `Unhealthy` with the findings
    /// as message for devices with findings, `Healthy` (as of `healthy_since`) for the others.
    pub fn device_health<'a>(
        &self,
        inventory: &GpuInventory,
        pool: &str,
        devices: impl IntoIterator<Item = &'a str>,
        healthy_since: SystemTime,
    ) -> Vec<DeviceHealth> {
        devices
            .into_iter()
            .map(|name| {
                let findings = self.for_device(inventory, name);
                let (status, last_updated, message) = if findings.is_empty() {
                    (HealthStatus::Healthy, healthy_since, String::new())
                } else {
                    let since = findings
                        .iter()
                        .map(|f| f.since)
                        .max()
                        .unwrap_or(healthy_since);
                    let message = findings
                        .iter()
                        .map(|f| f.finding.message.as_str())
                        .collect::<Vec<_>>()
                        .join("; ");
                    (HealthStatus::Unhealthy, since, message)
                };
                DeviceHealth {
                    pool_name: pool.to_owned(),
                    device_name: name.to_owned(),
                    status,
                    last_updated,
                    health_check_timeout: None,
                    message,
                }
            })
            .collect()
    }
}

/// A `SystemTime` as the API's timestamp (whole seconds; the epoch for earlier times).
fn timestamp(time: SystemTime) -> k8s_openapi::jiff::Timestamp {
    let seconds = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// The effect of the strongest finding among `taints`, for logs.
pub fn strongest(findings: &[&DatedFinding]) -> Option<TaintEffect> {
    findings.iter().map(|f| f.finding.effect).max()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tessera_gpu_inventory::{DeviceSource, MockSource};
    use tessera_nvml::HealthEventKind;

    use super::*;
    use tessera_prepare::inventory::lost::LostGpus;

    fn event(uuid: &str, kind: HealthEventKind, instance: Option<(u32, u32)>) -> HealthEvent {
        HealthEvent {
            gpu_uuid: uuid.to_owned(),
            kind,
            gpu_instance_id: instance.map(|(gi, _)| gi),
            compute_instance_id: instance.map(|(_, ci)| ci),
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
    }

    #[test]
    fn a_gpu_event_taints_the_gpu_and_repeats_change_nothing() {
        let inventory = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
        let gpu = &inventory.gpus[2];
        let name = format!("gpu-{}", gpu.minor);
        let mut findings = HealthFindings::default();
        assert!(
            findings
                .record(&event(&gpu.uuid, HealthEventKind::Xid(13), None), at(0))
                .is_none()
        );
        assert!(findings.is_empty(), "application XIDs are ignored");
        assert!(
            findings
                .record(&event(&gpu.uuid, HealthEventKind::Xid(63), None), at(1))
                .is_some()
        );
        assert!(
            findings
                .record(&event(&gpu.uuid, HealthEventKind::Xid(63), None), at(2))
                .is_none()
        );
        assert!(
            findings
                .record(&event(&gpu.uuid, HealthEventKind::Xid(79), None), at(3))
                .is_some()
        );
        assert!(
            findings
                .record(&event(&gpu.uuid, HealthEventKind::Xid(74), None), at(4))
                .is_none(),
            "a weaker XID does not replace a stronger one"
        );

        let names: Vec<String> = inventory
            .gpus
            .iter()
            .map(|g| format!("gpu-{}", g.minor))
            .collect();
        let taints = findings.device_taints(&inventory, names.iter().map(String::as_str));
        assert_eq!(taints.len(), 1);
        let taint = &taints[&name][0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            ("gpu.tessera.dev/xid", Some("79"), "NoExecute")
        );
        assert_eq!(
            taint.time_added.as_ref().unwrap().0.as_second(),
            1_700_000_001,
            "first seen"
        );

        let health = findings.device_health(
            &inventory,
            "node-a",
            names.iter().map(String::as_str),
            at(0),
        );
        assert_eq!(health.len(), 8);
        let sick: Vec<_> = health
            .iter()
            .filter(|h| h.status == HealthStatus::Unhealthy)
            .collect();
        assert_eq!(sick.len(), 1);
        assert_eq!(sick[0].device_name, name);
        assert_eq!(sick[0].message, "XID 79: the GPU has fallen off the bus");
    }

    #[test]
    fn mig_events_taint_their_instance_and_gpu_events_every_mig_device() {
        let inventory = MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.mig_enabled() && g.mig.as_ref().unwrap().instances.len() >= 2)
            .unwrap();
        let instances = &gpu.mig.as_ref().unwrap().instances;
        let names: Vec<String> = instances
            .iter()
            .map(|i| {
                tessera_gpu_inventory::DeviceName::mig(gpu.minor, &i.profile, i.placement_start)
                    .to_string()
            })
            .collect();
        let first = &instances[0];
        let mut findings = HealthFindings::default();
        findings.record(
            &event(
                &gpu.uuid,
                HealthEventKind::DoubleBitEcc,
                Some((first.gpu_instance_id, first.compute_instance_id)),
            ),
            at(0),
        );
        let taints = findings.device_taints(&inventory, names.iter().map(String::as_str));
        assert_eq!(
            taints.keys().collect::<Vec<_>>(),
            [&names[0]],
            "only the MIG device hit"
        );
        assert_eq!(taints[&names[0]][0].key, "gpu.tessera.dev/ecc");

        findings.record(&event(&gpu.uuid, HealthEventKind::Xid(74), None), at(1));
        let taints = findings.device_taints(&inventory, names.iter().map(String::as_str));
        assert_eq!(
            taints.len(),
            names.len(),
            "a GPU-wide event reaches every MIG device"
        );
        assert_eq!(taints[&names[0]].len(), 2);
        assert_eq!(
            strongest(&findings.for_device(&inventory, &names[0])),
            Some(TaintEffect::NoExecute)
        );
    }

    #[test]
    fn a_lost_gpu_taints_every_mig_device_from_when_it_was_found_lost() {
        let full = MockSource::new("hgx-a100-mig")
            .unwrap()
            .inventory()
            .unwrap();
        let gpu = full.gpus.iter().find(|g| g.mig_enabled()).unwrap();
        let mig_names: Vec<String> = gpu
            .mig
            .as_ref()
            .unwrap()
            .instances
            .iter()
            .map(|i| {
                tessera_gpu_inventory::DeviceName::mig(gpu.minor, &i.profile, i.placement_start)
                    .to_string()
            })
            .collect();
        assert!(!mig_names.is_empty());
        let mut read = full.clone();
        read.gpus.retain(|g| g.uuid != gpu.uuid);
        read.lost_gpus = vec![gpu.uuid.clone()];
        let mut lost = LostGpus::default();
        let merged = lost.merge(read.clone(), Some(&full), at(1));
        let merged = lost.merge(read, Some(&merged), at(5));
        let kept = |lost: &LostGpus| {
            let kept = lost.kept_since();
            kept.map(|(uuid, since)| (uuid.to_owned(), since))
                .collect::<Vec<_>>()
        };

        let mut findings = HealthFindings::default();
        findings.record_lost(kept(&lost));
        let taints = findings.device_taints(&merged, mig_names.iter().map(String::as_str));
        assert_eq!(taints.len(), mig_names.len(), "every MIG device of the GPU");
        let taint = &taints[&mig_names[0]][0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            (
                "gpu.tessera.dev/unreachable",
                Some("gpu-is-lost"),
                "NoExecute"
            )
        );
        assert_eq!(
            taint.time_added.as_ref().unwrap().0.as_second(),
            1_700_000_001
        );

        lost.merge(full.clone(), Some(&merged), at(9));
        let mut findings = HealthFindings::default();
        findings.record_lost(kept(&lost));
        assert!(findings.is_empty(), "the taint goes when the GPU answers");
    }

    #[test]
    fn a_gpu_off_its_fabric_is_tainted_from_the_first_rescan_that_read_it_until_one_reads_it_usable()
     {
        let mut inventory = MockSource::new("gb200-tray").unwrap().inventory().unwrap();
        let names: Vec<String> = inventory
            .gpus
            .iter()
            .map(|g| tessera_gpu_inventory::DeviceName::Gpu { minor: g.minor }.to_string())
            .collect();
        let mut fabric = FabricStates::default();
        fabric.observe(&inventory, at(1));
        let mut findings = HealthFindings::default();
        findings.record_fabric(&fabric);
        assert!(
            findings.is_empty(),
            "a registered, healthy fabric taints nothing"
        );

        let gpu = &mut inventory.gpus[1];
        gpu.fabric.as_mut().unwrap().state = tessera_gpu_inventory::FabricState::InProgress;
        let uuid = gpu.uuid.clone();
        fabric.observe(&inventory, at(2));
        fabric.observe(&inventory, at(3));
        let mut findings = HealthFindings::default();
        findings.record_fabric(&fabric);
        let taints = findings.device_taints(&inventory, names.iter().map(String::as_str));
        assert_eq!(taints.len(), 1, "{taints:?}");
        let taint = &taints[&names[1]][0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            ("gpu.tessera.dev/fabric", Some("in-progress"), "NoSchedule")
        );
        assert_eq!(
            taint.time_added.as_ref().unwrap().0.as_second(),
            1_700_000_002,
            "since the first rescan that read it"
        );
        assert!(findings.for_device(&inventory, &names[0]).is_empty());
        assert_eq!(fabric.findings.keys().collect::<Vec<_>>(), [&uuid]);

        let gpu = &mut inventory.gpus[1];
        let info = gpu.fabric.as_mut().unwrap();
        info.state = tessera_gpu_inventory::FabricState::Completed;
        info.health = tessera_gpu_inventory::FabricHealth::Unhealthy;
        fabric.observe(&inventory, at(4));
        let mut findings = HealthFindings::default();
        findings.record_fabric(&fabric);
        let found = findings.for_device(&inventory, &names[1]);
        assert_eq!(found[0].finding.value, "unhealthy");

        inventory.gpus[1].fabric.as_mut().unwrap().health =
            tessera_gpu_inventory::FabricHealth::Healthy;
        fabric.observe(&inventory, at(5));
        let mut findings = HealthFindings::default();
        findings.record_fabric(&fabric);
        assert!(
            findings.is_empty(),
            "the taint goes when a rescan reads the fabric usable"
        );
    }
}
