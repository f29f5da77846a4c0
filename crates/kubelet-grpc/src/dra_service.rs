//! `v1.DRAPlugin` and `v1beta1.DRAPlugin` served over one [`DraDriver`].
//!
//! Both versions share [`ClaimCalls`], which checks the batch, calls the driver and makes sure
//! every requested claim gets exactly one answer. The two tonic services only convert messages.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::driver::{
    ClaimRef, ClaimUid, DraDriver, PrepareResult, PreparedDevice, UnprepareResult,
};
use crate::proto::{dra_v1, dra_v1beta1};
use crate::stop::StopSignal;

/// The longest per-claim error text sent to the kubelet. The kubelet copies it into pod events
/// (whose message holds 1 KiB) and refuses replies over 4 MiB, so an error that echoes a user's
/// value must not grow with it. Longer texts are cut at a character boundary and say so.
pub const MAX_CLAIM_ERROR_BYTES: usize = 1024;

/// `text` cut to at most `max` bytes (at a character boundary), ending in a note of how much
/// was cut: for messages that echo values a user controls.
pub fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let note = format!("… ({} bytes cut)", text.len());
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end])
}

/// A driver error as the kubelet gets it.
fn wire_error(error: impl std::fmt::Display) -> String {
    bounded(&error.to_string(), MAX_CLAIM_ERROR_BYTES)
}

/// A claim as it arrived on the wire, before it is checked.
#[derive(Debug)]
struct WireClaim {
    namespace: String,
    name: String,
    uid: String,
}

impl From<dra_v1::Claim> for WireClaim {
    fn from(claim: dra_v1::Claim) -> Self {
        Self {
            namespace: claim.namespace,
            name: claim.name,
            uid: claim.uid,
        }
    }
}

impl From<dra_v1beta1::Claim> for WireClaim {
    fn from(claim: dra_v1beta1::Claim) -> Self {
        Self {
            namespace: claim.namespace,
            name: claim.name,
            uid: claim.uid,
        }
    }
}

/// A request batch split into the claims the driver sees and the claims answered here.
#[derive(Debug, Default, PartialEq)]
struct CheckedBatch {
    /// Well-formed claims, each UID once, in request order.
    accepted: Vec<ClaimRef>,
    /// Claims rejected without calling the driver, with the reason.
    rejected: BTreeMap<ClaimUid, String>,
}

/// At most this many bytes of a value the kubelet sent are echoed in a message about it.
const ECHOED_BYTES: usize = 64;

/// `value` for a message, cut to [`ECHOED_BYTES`].
fn short(value: &str) -> String {
    bounded(value, ECHOED_BYTES)
}

/// `value` for a message: quoted, cut to [`ECHOED_BYTES`].
fn echo(value: &str) -> String {
    format!("`{}`", short(value))
}

fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
}

/// Kubernetes UIDs are UUIDs; anything of letters, digits and '-' up to 128 bytes is accepted.
fn is_uid(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Why a claim reference is not one Kubernetes could have sent, if it is not: the namespace
/// must be a DNS-1123 label, the name a DNS-1123 subdomain, the UID letters, digits and '-'.
/// Drivers use these values in API paths and file names, so nothing else reaches them.
fn invalid_identity(namespace: &str, name: &str, uid: &str) -> Option<String> {
    let mut problems = Vec::new();
    if !is_dns_label(namespace) {
        problems.push(format!(
            "the namespace {} is not a DNS-1123 label (at most 63 lowercase letters, digits \
             and '-', starting and ending with a letter or digit)",
            echo(namespace)
        ));
    }
    if !is_dns_subdomain(name) {
        problems.push(format!(
            "the name {} is not a DNS-1123 subdomain (at most 253 lowercase letters, digits, \
             '-' and '.', each part starting and ending with a letter or digit)",
            echo(name)
        ));
    }
    if !is_uid(uid) {
        problems.push(format!(
            "the uid {} is not a Kubernetes UID (at most 128 letters, digits and '-')",
            echo(uid)
        ));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Checks a batch: an empty UID fails the call (there is no key to answer under); an empty
/// or malformed namespace, name or UID, or one UID sent with two different identities, fails
/// that claim; an exact repeat of a claim is answered once. Messages echo at most
/// [`ECHOED_BYTES`] of each value.
fn check_batch(method: &str, claims: Vec<WireClaim>) -> Result<CheckedBatch, Status> {
    let mut batch = CheckedBatch::default();
    for (index, claim) in claims.into_iter().enumerate() {
        if claim.uid.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{method}: claim {index} ({}/{}) has an empty uid; every claim needs \
                 its namespace, name and uid",
                short(&claim.namespace),
                short(&claim.name)
            )));
        }
        let uid = ClaimUid::new(claim.uid);
        if batch.rejected.contains_key(&uid) {
            continue;
        }
        let missing = match (claim.namespace.is_empty(), claim.name.is_empty()) {
            (true, true) => Some("namespace and name are"),
            (true, false) => Some("namespace is"),
            (false, true) => Some("name is"),
            (false, false) => None,
        };
        let problem = match missing {
            Some(missing) => Some(format!(
                "{missing} empty in the {method} request; every claim needs its namespace, \
                 name and uid"
            )),
            None => invalid_identity(&claim.namespace, &claim.name, uid.as_str()),
        };
        if let Some(problem) = problem {
            batch.accepted.retain(|accepted| accepted.uid != uid);
            let message = format!(
                "claim {}/{} ({}): {problem}",
                short(&claim.namespace),
                short(&claim.name),
                short(uid.as_str())
            );
            batch.rejected.insert(uid, message);
            continue;
        }
        let claim = ClaimRef::new(claim.namespace, claim.name, uid);
        match batch.accepted.iter().position(|seen| seen.uid == claim.uid) {
            None => batch.accepted.push(claim),
            Some(at) if batch.accepted[at] == claim => {}
            Some(at) => {
                let first = batch.accepted.remove(at);
                let message = format!(
                    "claim uid {} appears twice in the {method} request, as {}/{} and as {}/{}; \
                     a uid names exactly one claim",
                    claim.uid, first.namespace, first.name, claim.namespace, claim.name
                );
                // (Every value here passed `invalid_identity`: short.)
                batch.rejected.insert(claim.uid, message);
            }
        }
    }
    Ok(batch)
}

/// The driver's answers with each error as the text the kubelet gets.
fn to_wire<T, E: std::fmt::Display>(
    results: BTreeMap<ClaimUid, Result<T, E>>,
) -> BTreeMap<ClaimUid, Result<T, String>> {
    results
        .into_iter()
        .map(|(uid, result)| (uid, result.map_err(wire_error)))
        .collect()
}

/// Completes the driver's answer: one entry per accepted claim (an error where the driver gave
/// none), nothing for claims not asked for, plus the claims rejected by [`check_batch`].
fn complete_results<T>(
    method: &str,
    accepted: &[ClaimRef],
    rejected: BTreeMap<ClaimUid, String>,
    mut from_driver: BTreeMap<ClaimUid, Result<T, String>>,
) -> BTreeMap<ClaimUid, Result<T, String>> {
    let mut results: BTreeMap<_, _> = rejected
        .into_iter()
        .map(|(uid, message)| (uid, Err(wire_error(message))))
        .collect();
    for claim in accepted {
        let result = from_driver.remove(&claim.uid).unwrap_or_else(|| {
            tracing::error!(claim = %claim, method, "driver returned no result for a claim");
            Err(format!(
                "claim {claim}: the driver returned no result for it from {method}; \
                 this is a driver bug, the kubelet will retry"
            ))
        });
        results.insert(claim.uid.clone(), result);
    }
    for uid in from_driver.keys() {
        tracing::warn!(%uid, method, "driver returned a result for a claim that was not requested; dropped");
    }
    results
}

/// Strips subrequest suffixes (`request/subrequest` becomes `request`) and repeats.
fn request_names_for_kubelet(names: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let name = match name.split_once('/') {
            Some((request, _subrequest)) => request.to_owned(),
            None => name,
        };
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The version-independent half of the DRA services.
pub(crate) struct ClaimCalls<D> {
    driver: Arc<D>,
    /// Held across each driver call when calls are serialized.
    call_lock: Option<Arc<Mutex<()>>>,
    /// Fires when the shutdown grace period is over: waiting calls give up.
    cut_off: StopSignal,
}

impl<D: DraDriver> ClaimCalls<D> {
    pub(crate) fn new(driver: Arc<D>, serialize_calls: bool, cut_off: StopSignal) -> Self {
        Self {
            driver,
            call_lock: serialize_calls.then(|| Arc::new(Mutex::new(()))),
            cut_off,
        }
    }

    async fn prepare(
        &self,
        method: &'static str,
        claims: Vec<WireClaim>,
    ) -> Result<BTreeMap<ClaimUid, PrepareResult>, Status> {
        let mut results = self
            .batch(method, claims, |driver, claims| async move {
                driver.prepare(claims).await
            })
            .await?;
        for devices in results.values_mut().flat_map(|result| result.as_mut().ok()) {
            for device in devices.iter_mut() {
                device.request_names =
                    request_names_for_kubelet(std::mem::take(&mut device.request_names));
            }
        }
        Ok(results)
    }

    async fn unprepare(
        &self,
        method: &'static str,
        claims: Vec<WireClaim>,
    ) -> Result<BTreeMap<ClaimUid, UnprepareResult>, Status> {
        self.batch(method, claims, |driver, claims| async move {
            driver.unprepare(claims).await
        })
        .await
    }

    /// One batch call of either kind: the claims checked ([`check_batch`]), the accepted ones
    /// handed to `call` (on its own task, see [`Self::run`]; not at all when none is left), and
    /// one result per claim asked for ([`complete_results`]).
    async fn batch<T, E, Call, Answer>(
        &self,
        method: &'static str,
        claims: Vec<WireClaim>,
        call: Call,
    ) -> Result<BTreeMap<ClaimUid, Result<T, String>>, Status>
    where
        Call: FnOnce(Arc<D>, Vec<ClaimRef>) -> Answer,
        Answer: Future<Output = BTreeMap<ClaimUid, Result<T, E>>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display,
    {
        let batch = check_batch(method, claims)?;
        let from_driver = if batch.accepted.is_empty() {
            BTreeMap::new()
        } else {
            let answer = call(Arc::clone(&self.driver), batch.accepted.clone());
            self.run(method, async move { to_wire(answer.await) })
                .await?
        };
        Ok(complete_results(
            method,
            &batch.accepted,
            batch.rejected,
            from_driver,
        ))
    }

    /// Runs one driver call on its own task (so a panic becomes a status, and a call the
    /// kubelet gave up on still finishes), under the call lock when calls are serialized.
    /// At cut-off the kubelet gets `UNAVAILABLE` while the driver's task runs on.
    async fn run<T: Send + 'static>(
        &self,
        method: &'static str,
        call: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, Status> {
        let lock = self.call_lock.clone();
        let task = tokio::spawn(async move {
            let _serialized = match &lock {
                Some(lock) => Some(lock.lock().await),
                None => None,
            };
            call.await
        });
        tokio::select! {
            joined = task => joined.map_err(|join_error| {
                tracing::error!(method, error = %join_error, "driver call panicked");
                Status::internal(format!(
                    "{method}: the driver failed unexpectedly ({join_error}); the plugin log has details"
                ))
            }),
            () = self.cut_off.clone().stopped() => Err(Status::unavailable(format!(
                "{method}: the plugin shut down before the driver finished; the kubelet retries the call"
            ))),
        }
    }
}

/// `v1.DRAPlugin`.
pub(crate) struct DraV1Service<D>(pub(crate) Arc<ClaimCalls<D>>);

/// `v1beta1.DRAPlugin`.
pub(crate) struct DraV1beta1Service<D>(pub(crate) Arc<ClaimCalls<D>>);

/// Implements one gRPC version's `DRAPlugin` over [`ClaimCalls`]. The versions' messages differ
/// only in their package (and in v1beta1 lacking a share id, which `$device` handles), so the
/// plumbing is written once.
macro_rules! dra_plugin_service {
    ($service:ident, $proto:ident, $device:ident, $version:literal) => {
        #[tonic::async_trait]
        impl<D: DraDriver> $proto::dra_plugin_server::DraPlugin for $service<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<$proto::NodePrepareResourcesRequest>,
            ) -> Result<Response<$proto::NodePrepareResourcesResponse>, Status> {
                let method = concat!($version, ".DRAPlugin/NodePrepareResources");
                let claims = wire_claims(request.into_inner().claims);
                let results = self.0.prepare(method, claims).await?;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let response = match result {
                            Ok(devices) => $proto::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($device).collect(),
                                error: String::new(),
                            },
                            Err(error) => $proto::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid.to_string(), response)
                    })
                    .collect();
                Ok(Response::new($proto::NodePrepareResourcesResponse {
                    claims,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$proto::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$proto::NodeUnprepareResourcesResponse>, Status> {
                let method = concat!($version, ".DRAPlugin/NodeUnprepareResources");
                let claims = wire_claims(request.into_inner().claims);
                let results = self.0.unprepare(method, claims).await?;
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        (
                            uid.to_string(),
                            $proto::NodeUnprepareResourceResponse { error },
                        )
                    })
                    .collect();
                Ok(Response::new($proto::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_plugin_service!(DraV1Service, dra_v1, device_v1, "v1");
dra_plugin_service!(DraV1beta1Service, dra_v1beta1, device_v1beta1, "v1beta1");

/// A request's claims (either version's message) as the version-independent half takes them.
fn wire_claims<C>(claims: Vec<C>) -> Vec<WireClaim>
where
    WireClaim: From<C>,
{
    claims.into_iter().map(WireClaim::from).collect()
}

fn device_v1(device: PreparedDevice) -> dra_v1::Device {
    dra_v1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: device.share_id,
    }
}

fn device_v1beta1(device: PreparedDevice) -> dra_v1beta1::Device {
    if let Some(share_id) = &device.share_id {
        tracing::debug!(
            device = %device.device_name,
            share_id,
            "v1beta1.DRAPlugin cannot carry a share id; the kubelet does not see it"
        );
    }
    dra_v1beta1::Device {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(namespace: &str, name: &str, uid: &str) -> WireClaim {
        WireClaim {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn empty_uid_fails_the_whole_call_and_names_the_claim() {
        let status =
            check_batch("m", vec![wire("ns", "a", "u1"), wire("ns", "b", "")]).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("claim 1 (ns/b) has an empty uid"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn missing_namespace_or_name_fails_only_that_claim() {
        let batch = check_batch(
            "m",
            vec![
                wire("", "a", "u1"),
                wire("ns", "", "u2"),
                wire("ns", "c", "u3"),
            ],
        )
        .unwrap();
        assert_eq!(batch.accepted, vec![ClaimRef::new("ns", "c", "u3")]);
        assert!(batch.rejected[&ClaimUid::from("u1")].contains("namespace is empty"));
        assert!(batch.rejected[&ClaimUid::from("u2")].contains("name is empty"));
    }

    #[test]
    fn malformed_identities_fail_only_that_claim_and_echo_little() {
        let huge = "n".repeat(4 << 20);
        let batch = check_batch(
            "m",
            vec![
                wire("ns", "a?watch=true", "u1"),
                wire("ns", "b", "../../victim"),
                wire("NS", "c", "u3"),
                wire("ns", &huge, "u4"),
                wire("ns", "-d", "u5"),
                wire("ns", "e.f-1", "8d4f3c2e-0000-4000-8000-000000000001"),
            ],
        )
        .unwrap();
        assert_eq!(
            batch.accepted,
            vec![ClaimRef::new(
                "ns",
                "e.f-1",
                "8d4f3c2e-0000-4000-8000-000000000001"
            )]
        );
        for (uid, field) in [
            ("u1", "the name `a?watch=true`"),
            ("../../victim", "the uid `../../victim`"),
            ("u3", "the namespace `NS`"),
            ("u4", "is not a DNS-1123 subdomain"),
            ("u5", "the name `-d`"),
        ] {
            let message = &batch.rejected[&ClaimUid::from(uid)];
            assert!(message.contains(field), "{uid}: {message}");
            assert!(message.len() < 1024, "{uid}: {} bytes", message.len());
        }
        assert_eq!(bounded("short", 64), "short");
        let cut = bounded(&"é".repeat(1000), 100);
        assert!(
            cut.len() <= 100 && cut.ends_with("(2000 bytes cut)"),
            "{cut}"
        );
    }

    #[test]
    fn exact_repeat_is_answered_once_and_conflicting_repeat_is_rejected() {
        let batch = check_batch(
            "m",
            vec![
                wire("ns", "a", "u1"),
                wire("ns", "a", "u1"),
                wire("ns", "b", "u2"),
                wire("other", "b", "u2"),
                wire("ns", "b", "u2"),
            ],
        )
        .unwrap();
        assert_eq!(batch.accepted, vec![ClaimRef::new("ns", "a", "u1")]);
        let message = &batch.rejected[&ClaimUid::from("u2")];
        assert!(message.contains("as ns/b and as other/b"), "{message}");
    }

    #[test]
    fn results_cover_exactly_the_requested_claims() {
        let accepted = vec![
            ClaimRef::new("ns", "a", "u1"),
            ClaimRef::new("ns", "b", "u2"),
        ];
        let rejected = BTreeMap::from([(ClaimUid::from("u3"), "bad".to_owned())]);
        let from_driver = BTreeMap::from([
            (ClaimUid::from("u1"), Ok(())),
            (ClaimUid::from("stranger"), Ok(())),
        ]);
        let results = complete_results("m", &accepted, rejected, from_driver);
        assert_eq!(
            results.keys().map(ClaimUid::as_str).collect::<Vec<_>>(),
            ["u1", "u2", "u3"]
        );
        assert_eq!(results[&ClaimUid::from("u1")], Ok(()));
        assert!(
            results[&ClaimUid::from("u2")]
                .as_ref()
                .unwrap_err()
                .contains("returned no result")
        );
        assert_eq!(results[&ClaimUid::from("u3")], Err("bad".to_owned()));
    }

    #[test]
    fn subrequest_suffixes_are_stripped_and_repeats_dropped() {
        let names = vec!["gpu/large".into(), "gpu/small".into(), "nic".into()];
        assert_eq!(request_names_for_kubelet(names), ["gpu", "nic"]);
    }
}
