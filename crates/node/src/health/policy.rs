//! What an NVML health event means for the device: the taint policy. Pure.
//!
//! | event | taint | effect | why |
//! |---|---|---|---|
//! | XID 79 | `gpu.tessera.dev/xid=79` | NoExecute | the GPU fell off the bus: running work is lost |
//! | XID 48 | `gpu.tessera.dev/xid=48` | NoExecute | double-bit (uncorrectable) ECC error: data in use is corrupt |
//! | XID 95 | `gpu.tessera.dev/xid=95` | NoExecute | uncontained ECC error: every context on the GPU is affected |
//! | XID 140 | `gpu.tessera.dev/xid=140` | NoExecute | unrecovered ECC error |
//! | XID 61, 62 | `gpu.tessera.dev/xid=<n>` | NoSchedule | internal micro-controller breakpoint / halt: needs a GPU reset |
//! | XID 63, 64 | `gpu.tessera.dev/xid=<n>` | NoSchedule | ECC page retirement / row remapping recorded (63) or failed (64): needs a reset |
//! | XID 74 | `gpu.tessera.dev/xid=74` | NoSchedule | NVLink error |
//! | XID 92 | `gpu.tessera.dev/xid=92` | NoSchedule | high single-bit ECC error rate |
//! | XID 94 | `gpu.tessera.dev/xid=94` | NoSchedule | contained ECC error: the affected application was stopped; reset when possible |
//! | XID 119, 120 | `gpu.tessera.dev/xid=<n>` | NoSchedule | GSP firmware timeout / error: needs a reset |
//! | XID 144–150 | `gpu.tessera.dev/xid=<n>` | NoSchedule | NVLink5 fabric errors of Blackwell GPUs (B100, GB200: SAW, RLW, TLW, TREX, NVLPW control, NETIR, MSE): the GPU's links to the fabric need NVIDIA's NVLink workflow, often a reset |
//! | double-bit ECC event | `gpu.tessera.dev/ecc=double-bit` | NoExecute | uncorrectable memory error |
//! | single-bit ECC event | — | — | corrected by the hardware; counted in metrics only |
//! | any other XID (13, 31, 43, 45, 68, …) | — | — | caused by the application (illegal address, page fault, stopped channel); the GPU is fine |
//! | rescan finds the GPU lost (`NVML_ERROR_GPU_IS_LOST`) | `gpu.tessera.dev/unreachable=gpu-is-lost` | NoExecute | the GPU does not answer: running work is lost |
//! | rescan: fabric registration not started / in progress | `gpu.tessera.dev/fabric=not-started` / `in-progress` | NoSchedule | on an NVLink fabric (NVSwitch) system CUDA cannot use the GPU until the fabric manager registers it |
//! | rescan: fabric registration completed with an error status | `gpu.tessera.dev/fabric=registration-failed` | NoSchedule | the GPU is not on the fabric |
//! | rescan: fabric health summary `UNHEALTHY` | `gpu.tessera.dev/fabric=unhealthy` | NoSchedule | the GPU's fabric links or routes are broken (`LIMITED_CAPACITY`, less bandwidth, does not taint) |
//!
//! NoSchedule keeps new claims off the device; NoExecute also evicts the pods using it (with
//! DRADeviceTaints). A device keeps an event's taint until the plugin restarts (after the GPU
//! reset or node reboot that such errors need), or, with `--health-recovery-after`, until no event
//! confirmed it for that long; `--ignored-xids` takes XIDs out of this table (the monitor applies
//! both: [`super::monitor::HealthSettings`]). The unreachable taint is not an event but the
//! state of the last rescan, and goes at the first rescan the GPU answers again. The kubelet
//! health stream reports every tainted device `UNHEALTHY`, with the finding as message.

use tessera_api::names::taints;
use tessera_gpu_inventory::{FabricHealth, FabricInfo, FabricState};
use tessera_nvml::HealthEventKind;

/// Taint effects health monitoring uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaintEffect {
    /// No new allocations.
    NoSchedule,
    /// No new allocations, and pods using the device are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// What an event means for the device it was reported on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthFinding {
    /// Taint key ([`taints::XID`] or [`taints::ECC`]).
    pub key: &'static str,
    /// Taint value: the XID number, or `double-bit`.
    pub value: String,
    pub effect: TaintEffect,
    /// Human-readable cause, for the kubelet health stream and logs.
    pub message: String,
}

/// XIDs that make running work fail or corrupt it.
const EVICTING_XIDS: &[(u64, &str)] = &[
    (48, "double-bit ECC error"),
    (79, "the GPU has fallen off the bus"),
    (95, "uncontained ECC error"),
    (140, "unrecovered ECC error"),
];

/// XIDs after which the GPU needs attention (a reset) before it takes new work.
const FENCING_XIDS: &[(u64, &str)] = &[
    (61, "internal micro-controller breakpoint"),
    (62, "internal micro-controller halt"),
    (
        63,
        "ECC page retirement or row remapping recorded; a GPU reset applies it",
    ),
    (64, "ECC page retirement or row remapping failed"),
    (74, "NVLink error"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (144, "NVLink fabric error (SAW)"),
    (145, "NVLink fabric error (RLW)"),
    (146, "NVLink fabric error (TLW)"),
    (147, "NVLink fabric error (TREX)"),
    (148, "NVLink fabric error (NVLPW control)"),
    (
        149,
        "NVLink fabric error (NETIR: link down or fabric interrupt)",
    ),
    (150, "NVLink fabric error (MSE)"),
];

/// The finding for an event, or `None` when the device stays schedulable.
pub fn classify(kind: HealthEventKind) -> Option<HealthFinding> {
    match kind {
        HealthEventKind::Xid(xid) => {
            let (effect, cause) = EVICTING_XIDS
                .iter()
                .find(|(n, _)| *n == xid)
                .map(|(_, cause)| (TaintEffect::NoExecute, *cause))
                .or_else(|| {
                    FENCING_XIDS
                        .iter()
                        .find(|(n, _)| *n == xid)
                        .map(|(_, cause)| (TaintEffect::NoSchedule, *cause))
                })?;
            Some(HealthFinding {
                key: taints::XID,
                value: xid.to_string(),
                effect,
                message: format!("XID {xid}: {cause}"),
            })
        }
        HealthEventKind::DoubleBitEcc => Some(HealthFinding {
            key: taints::ECC,
            value: "double-bit".to_owned(),
            effect: TaintEffect::NoExecute,
            message: "uncorrectable (double-bit) ECC error".to_owned(),
        }),
        HealthEventKind::SingleBitEcc => None,
    }
}

/// The finding for a GPU's fabric state as the last rescan read it (`nvmlDeviceGetGpuFabricInfoV`),
/// or `None` when the GPU can use its fabric or has none. Like [`unreachable`], a state, not an
/// event: it goes at the first rescan that reads the fabric usable.
pub fn fabric(fabric: &FabricInfo) -> Option<HealthFinding> {
    let (value, message) = match fabric.state {
        FabricState::NotSupported => return None,
        FabricState::NotStarted | FabricState::InProgress => {
            let value = if fabric.state == FabricState::NotStarted {
                "not-started"
            } else {
                "in-progress"
            };
            (
                value,
                format!(
                    "NVLink fabric registration {value}: CUDA cannot use the GPU until the fabric \
                     manager registers it"
                ),
            )
        }
        FabricState::Completed if fabric.status != 0 => (
            "registration-failed",
            format!(
                "NVLink fabric registration failed (NVML status {}): the GPU is not on the fabric",
                fabric.status
            ),
        ),
        FabricState::Completed if fabric.health == FabricHealth::Unhealthy => (
            "unhealthy",
            "the NVLink fabric reports the GPU unhealthy (health summary UNHEALTHY)".to_owned(),
        ),
        FabricState::Completed => return None,
    };
    Some(HealthFinding {
        key: taints::FABRIC,
        value: value.to_owned(),
        effect: TaintEffect::NoSchedule,
        message,
    })
}

/// The finding for a GPU that a rescan found lost: it stays published with its last known
/// facts, and this taints it (and its MIG devices).
pub fn unreachable() -> HealthFinding {
    HealthFinding {
        key: taints::UNREACHABLE,
        value: "gpu-is-lost".to_owned(),
        effect: TaintEffect::NoExecute,
        message: "the GPU is unreachable: NVML answers NVML_ERROR_GPU_IS_LOST (it fell off the \
                  bus); published with its last known facts"
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_table() {
        for (kind, expected) in [
            (
                HealthEventKind::Xid(79),
                Some((taints::XID, "79", TaintEffect::NoExecute)),
            ),
            (
                HealthEventKind::Xid(48),
                Some((taints::XID, "48", TaintEffect::NoExecute)),
            ),
            (
                HealthEventKind::Xid(95),
                Some((taints::XID, "95", TaintEffect::NoExecute)),
            ),
            (
                HealthEventKind::Xid(63),
                Some((taints::XID, "63", TaintEffect::NoSchedule)),
            ),
            (
                HealthEventKind::Xid(74),
                Some((taints::XID, "74", TaintEffect::NoSchedule)),
            ),
            (
                HealthEventKind::Xid(94),
                Some((taints::XID, "94", TaintEffect::NoSchedule)),
            ),
            (
                HealthEventKind::DoubleBitEcc,
                Some((taints::ECC, "double-bit", TaintEffect::NoExecute)),
            ),
            (
                HealthEventKind::Xid(144),
                Some((taints::XID, "144", TaintEffect::NoSchedule)),
            ),
            (
                HealthEventKind::Xid(149),
                Some((taints::XID, "149", TaintEffect::NoSchedule)),
            ),
            (
                HealthEventKind::Xid(150),
                Some((taints::XID, "150", TaintEffect::NoSchedule)),
            ),
            (HealthEventKind::Xid(143), None),
            (HealthEventKind::Xid(151), None),
            (HealthEventKind::Xid(13), None),
            (HealthEventKind::Xid(31), None),
            (HealthEventKind::Xid(43), None),
            (HealthEventKind::SingleBitEcc, None),
        ] {
            let found = classify(kind);
            assert_eq!(
                found.as_ref().map(|f| (f.key, f.value.as_str(), f.effect)),
                expected,
                "{kind:?}"
            );
        }
        assert_eq!(
            classify(HealthEventKind::Xid(79)).unwrap().message,
            "XID 79: the GPU has fallen off the bus"
        );
    }

    #[test]
    fn a_gpu_that_cannot_use_its_fabric_is_fenced() {
        let info = |state, status, health| FabricInfo {
            cluster_uuid: "522c88f3-2731-5718-acd9-980cbf3d0f20".into(),
            clique_id: 7,
            state,
            status,
            health,
        };
        for (state, status, health, expected) in [
            (
                FabricState::NotSupported,
                0,
                FabricHealth::NotSupported,
                None,
            ),
            (FabricState::Completed, 0, FabricHealth::Healthy, None),
            (FabricState::Completed, 0, FabricHealth::NotSupported, None),
            (
                FabricState::Completed,
                0,
                FabricHealth::LimitedCapacity,
                None,
            ),
            (
                FabricState::NotStarted,
                0,
                FabricHealth::NotSupported,
                Some("not-started"),
            ),
            (
                FabricState::InProgress,
                0,
                FabricHealth::NotSupported,
                Some("in-progress"),
            ),
            (
                FabricState::Completed,
                999,
                FabricHealth::Healthy,
                Some("registration-failed"),
            ),
            (
                FabricState::Completed,
                0,
                FabricHealth::Unhealthy,
                Some("unhealthy"),
            ),
        ] {
            let found = fabric(&info(state, status, health));
            assert_eq!(
                found.as_ref().map(|f| f.value.as_str()),
                expected,
                "{state:?} {status} {health:?}"
            );
            if let Some(found) = found {
                assert_eq!(
                    (found.key, found.effect),
                    (taints::FABRIC, TaintEffect::NoSchedule)
                );
            }
        }
    }
}
