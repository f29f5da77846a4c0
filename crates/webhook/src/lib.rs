//! tessera-controller's admission webhook: the CA and serving certificate it makes itself
//! ([`certificates`]). The decisions it serves are `tessera-admission`'s; docs/admission.md says
//! how the webhook is deployed.

pub mod certificates;
