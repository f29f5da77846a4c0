//! The CDI spec of a prepared claim (pure): one spec per claim, vendor `gpu.tessera.dev`, class
//! `claim`, one CDI device per allocated device named `<claim uid>-<device name>`.

use tessera_api::DRIVER_NAME;

/// The CDI class of Tessera's per-claim specs.
pub const CDI_CLASS: &str = "claim";

/// The CDI device name of `device` in the spec of claim `claim_uid`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device id (`gpu.tessera.dev/claim=<uid>-<device>`).
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{DRIVER_NAME}/{CDI_CLASS}={}", device_name(claim_uid, device))
}
