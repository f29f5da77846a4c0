//! What Tessera's admission webhook decides, as functions of data (no IO): the device-plugin
//! conversion of pods ([`conversion`]) and the AdmissionReview envelope its answers travel in
//! ([`review`]). `tessera-controller` serves it; `tessera migrate` prints the same conversion for
//! a manifest. docs/admission.md describes both.

pub mod conversion;
pub mod review;

pub use conversion::{Conversion, ConversionTable, ConvertedRequest, Unconverted, convert};
