//! [`HeldPlacements`]: which claim holds each MIG placement — what undo and the placement check
//! need to know of "the other claims' records".

use std::collections::BTreeMap;

use tessera_kubelet_grpc::ClaimUid;

use crate::checkpoint::{ClaimRecord, DeviceTarget};

/// A MIG placement: GPU, profile, first memory slice.
type Placement = (String, String, u32);

fn placement(target: &DeviceTarget) -> Option<Placement> {
    match target {
        DeviceTarget::Mig {
            parent_uuid,
            profile,
            placement_start,
            ..
        } => Some((parent_uuid.clone(), profile.clone(), *placement_start)),
        DeviceTarget::Gpu { .. } => None,
    }
}

/// The MIG placements the given claims' records hold, each with its holders (claim UID and
/// `namespace/name`). Built once from a set of records; asked about one claim at a time, it
/// answers for the claims other than that one.
#[derive(Debug, Default)]
pub(super) struct HeldPlacements {
    holders: BTreeMap<Placement, Vec<(ClaimUid, String)>>,
}

impl HeldPlacements {
    /// The placements held by `records` (claim UID → record).
    pub(super) fn of<'a>(
        records: impl IntoIterator<Item = (&'a ClaimUid, &'a ClaimRecord)>,
    ) -> Self {
        let mut holders: BTreeMap<Placement, Vec<(ClaimUid, String)>> = BTreeMap::new();
        for (uid, record) in records {
            for device in &record.devices {
                if let Some(placement) = placement(&device.target) {
                    holders
                        .entry(placement)
                        .or_default()
                        .push((uid.clone(), record.display_name()));
                }
            }
        }
        Self { holders }
    }

    /// Another claim than `uid` that holds the placement of `target`: `namespace/name (uid)`.
    pub(super) fn held_by_other(&self, uid: &ClaimUid, target: &DeviceTarget) -> Option<String> {
        let holders = self.holders.get(&placement(target)?)?;
        holders
            .iter()
            .find(|(holder, _)| holder != uid)
            .map(|(holder, name)| format!("{name} ({holder})"))
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::{ClaimState, DeviceRecord, MigLifecycle};

    use super::*;

    fn record(name: &str, targets: Vec<DeviceTarget>) -> ClaimRecord {
        ClaimRecord {
            namespace: "ml".into(),
            name: name.into(),
            state: ClaimState::PrepareCompleted,
            devices: targets
                .into_iter()
                .map(|target| DeviceRecord {
                    request: "r".into(),
                    pool: "node-a".into(),
                    device: "d".into(),
                    cdi_device_ids: vec![],
                    target,
                    sharing: None,
                    share: None,
                })
                .collect(),
            mps: None,
            imex: None,
        }
    }

    fn mig(gpu: &str, start: u32) -> DeviceTarget {
        DeviceTarget::Mig {
            parent_uuid: gpu.into(),
            parent_minor: 0,
            profile: "1g.10gb".into(),
            placement_start: start,
            lifecycle: MigLifecycle::Dynamic,
            instance: None,
        }
    }

    #[test]
    fn a_placement_is_held_by_the_other_claims_only() {
        let records = BTreeMap::from([
            (ClaimUid::new("a"), record("one", vec![mig("GPU-1", 0)])),
            (ClaimUid::new("b"), record("two", vec![mig("GPU-1", 1)])),
        ]);
        let held = HeldPlacements::of(&records);
        assert_eq!(
            held.held_by_other(&ClaimUid::new("a"), &mig("GPU-1", 0)),
            None
        );
        assert_eq!(
            held.held_by_other(&ClaimUid::new("c"), &mig("GPU-1", 0))
                .as_deref(),
            Some("ml/one (a)")
        );
        assert_eq!(
            held.held_by_other(&ClaimUid::new("c"), &mig("GPU-2", 0)),
            None
        );
        let gpu = DeviceTarget::Gpu {
            uuid: "GPU-1".into(),
            minor: 0,
        };
        assert_eq!(held.held_by_other(&ClaimUid::new("c"), &gpu), None);
    }
}
