//! tessera-controller's admission webhook infrastructure: the CA and serving certificate it makes
//! itself ([`certificates`]), their form in the Secret every replica reads ([`secret`]), and the
//! HTTPS server answering AdmissionReviews, one path per webhook ([`server`]). The decisions it
//! serves are `tessera-admission`'s; the controller keeps the Secret and the webhook
//! configuration's `caBundle` (docs/admission.md).

pub mod certificates;
pub mod secret;
pub mod server;
