//! What Tessera's admission webhook decides, as functions of data (no IO): the device-plugin
//! conversion of pods ([`conversion`]), the check of claims' opaque configurations at creation
//! ([`claim_config`], shared with `tessera validate`) and the AdmissionReview envelope their
//! answers travel in ([`review`]). `tessera-controller` serves them; `tessera migrate` prints the
//! same conversion for a manifest, `tessera validate` the same configuration problems.
//! docs/admission.md and docs/operations.md ("Admission checks") describe them.

pub mod claim_config;
pub mod conversion;
pub mod review;

pub use conversion::{Conversion, ConversionTable, ConvertedRequest, Unconverted, convert};
