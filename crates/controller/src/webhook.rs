//! The admission webhook in the controller binary. Every replica serves it, not only the leader
//! (admission must not wait for an election), behind one Service:
//!
//! - the certificates live in one Secret: the first replica to find none makes a CA and a serving
//!   certificate and creates it, the others read it; whoever finds them due renews them under the
//!   same CA ([`tessera_webhook::certificates`]); writes are guarded by `resourceVersion`, so two
//!   replicas never both win;
//! - the CA bundle is written into the `caBundle` of the MutatingWebhookConfiguration (the
//!   conversion) and of the ValidatingWebhookConfiguration (the config check), each when named (a
//!   JSON patch guarded by `resourceVersion`), and written again when a `helm upgrade` or anyone
//!   else changed it;
//! - the server ([`tessera_webhook::server`]) answers the device-plugin conversion at
//!   [`CONVERSION_PATH`] from the DeviceClass cache (the table of what converts comes from the
//!   classes that exist), and the check of claims' opaque configurations at [`CONFIG_CHECK_PATH`]
//!   ([`tessera_admission::claim_config`], what `tessera validate` reports).
//!
//! Both are checked again every [`KEEP_EVERY`]. The templates converted pods name are created by
//! the leader, as a step of the pod's decision (`tessera_placement::decide`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde_json::json;
use tessera_admission::ConversionTable;
use tessera_admission::claim_config::review_claim_configs;
use tessera_admission::conversion::{MANAGED_BY, MANAGED_BY_LABEL};
use tessera_admission::review::{AdmissionRequest, AdmissionResponse, convert_pod_request};
use tessera_api::names::FIELD_MANAGER;
use tessera_webhook::certificates::{CertificateError, Certificates, Renewal, service_dns_names};
use tessera_webhook::server::{
    Review, Reviews, ServingCertificate, WebhookServer, WebhookServerError,
};

/// The path the device-plugin conversion is served at.
pub const CONVERSION_PATH: &str = "/convert-device-plugin-pods";
/// The path the check of claims' and claim templates' opaque configurations is served at.
pub const CONFIG_CHECK_PATH: &str = "/validate-claim-configs";
/// How often the Secret and the `caBundle` are checked again.
pub const KEEP_EVERY: Duration = Duration::from_secs(60);
/// Attempts at settling the Secret when other replicas write it at the same time.
const SECRET_ATTEMPTS: usize = 5;

/// Where the webhook serves and what it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Where the HTTPS server listens.
    pub address: SocketAddr,
    /// The namespace of the Secret and the Service (the controller's).
    pub namespace: String,
    /// The Service the API server calls: the serving certificate's names.
    pub service: String,
    /// The Secret holding the certificates.
    pub secret: String,
    /// The MutatingWebhookConfiguration whose `caBundle` the controller writes; empty: none.
    pub configuration: String,
    /// The ValidatingWebhookConfiguration whose `caBundle` the controller writes; empty: none.
    pub validating_configuration: String,
}

/// Why keeping the certificates failed (the webhook is retried at the next check).
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{action} Secret {namespace}/{name}: {source}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "Secret {namespace}/{name} kept changing under {SECRET_ATTEMPTS} attempts to settle it"
    )]
    SecretContended { namespace: String, name: String },
    #[error("{action} {kind} {name}: {source}")]
    Configuration {
        action: &'static str,
        kind: &'static str,
        name: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    #[error(transparent)]
    Serve(#[from] WebhookServerError),
}

/// The device-plugin conversion, answered from the DeviceClass cache.
pub struct DevicePluginConversion {
    pub classes: Store<DeviceClass>,
}

impl Review for DevicePluginConversion {
    fn name(&self) -> &'static str {
        "device-plugin-conversion"
    }

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        let classes: Vec<DeviceClass> = self
            .classes
            .state()
            .iter()
            .map(|c| DeviceClass::clone(c))
            .collect();
        let table = ConversionTable::from_device_classes(&classes);
        convert_pod_request(request, &table)
    }
}

/// The check of claims' opaque configurations: refuses at creation what prepare would refuse.
pub struct ClaimConfigCheck;

impl Review for ClaimConfigCheck {
    fn name(&self) -> &'static str {
        "claim-config-check"
    }

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        review_claim_configs(request)
    }
}

/// Serves the webhooks until `stop` completes: certificates first (retried until they are
/// settled), then the server, then the periodic checks. `ready` turns true once it serves.
pub async fn serve(
    client: Client,
    config: WebhookConfig,
    classes: Store<DeviceClass>,
    reviews: Reviews,
    ready: Arc<AtomicBool>,
    stop: tessera_process::Stop,
) -> Result<(), WebhookError> {
    let keeper = Keeper::new(client, &config);
    let certificate = Arc::new(ServingCertificate::default());
    while let Err(e) = keeper.keep(&certificate).await {
        tracing::warn!(error = %e, "admission webhook: certificates not ready; retrying");
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.cancelled() => return Ok(()),
        }
    }
    let server = WebhookServer::new(reviews)
        .route(
            CONVERSION_PATH,
            Arc::new(DevicePluginConversion { classes }),
        )
        .route(CONFIG_CHECK_PATH, Arc::new(ClaimConfigCheck));
    let (address, serving) = server
        .bind(
            config.address,
            certificate.clone(),
            stop.clone().cancelled_owned(),
        )
        .await?;
    let serving = tokio::spawn(serving);
    ready.store(true, Ordering::Release);
    tracing::info!(%address, service = %config.service, "admission webhook serving");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(KEEP_EVERY) => {}
            _ = stop.cancelled() => break,
        }
        if let Err(e) = keeper.keep(&certificate).await {
            tracing::warn!(error = %e, "admission webhook: keeping the certificates failed; serving the ones loaded");
        }
    }
    ready.store(false, Ordering::Release);
    match serving.await {
        Ok(served) => served.map_err(WebhookError::from),
        Err(e) => Err(WebhookError::Serve(WebhookServerError::Serve(
            std::io::Error::other(e),
        ))),
    }
}

/// Keeps the Secret and the webhook configurations' `caBundle`.
pub struct Keeper {
    secrets: Api<Secret>,
    configurations: Api<MutatingWebhookConfiguration>,
    validating_configurations: Api<ValidatingWebhookConfiguration>,
    config: WebhookConfig,
    dns_names: Vec<String>,
}

impl Keeper {
    pub fn new(client: Client, config: &WebhookConfig) -> Keeper {
        Keeper {
            secrets: Api::namespaced(client.clone(), &config.namespace),
            configurations: Api::all(client.clone()),
            validating_configurations: Api::all(client),
            dns_names: service_dns_names(&config.service, &config.namespace),
            config: config.clone(),
        }
    }

    /// Settles the Secret, serves its certificate, and writes its CA bundle where it is missing.
    pub async fn keep(
        &self,
        certificate: &ServingCertificate,
    ) -> Result<Certificates, WebhookError> {
        let certs = self.settle_secret().await?;
        certificate.load(&certs.cert, &certs.key)?;
        self.write_ca_bundle(&certs.ca_bundle).await?;
        Ok(certs)
    }

    /// The certificates in the Secret, made or renewed first when needed.
    pub async fn settle_secret(&self) -> Result<Certificates, WebhookError> {
        let name = &self.config.secret;
        for _ in 0..SECRET_ATTEMPTS {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let found = self
                .secrets
                .get_opt(name)
                .await
                .map_err(|e| self.secret_error("read", e))?;
            let Some(secret) = found else {
                let certs = Certificates::issue(&self.dns_names, now)?;
                match self
                    .secrets
                    .create(&PostParams::default(), &self.secret(&certs, None))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(secret = %name, "admission webhook: made a CA and a serving certificate");
                        return Ok(certs);
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Err(self.secret_error("create", e)),
                }
            };
            let data: BTreeMap<String, Vec<u8>> = secret
                .data
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            let next = match Certificates::from_secret_data(&data) {
                Ok(certs) => match certs.renewal(&self.dns_names, now)? {
                    Renewal::Keep => return Ok(certs),
                    Renewal::Replace(next) => next,
                },
                Err(e) => {
                    tracing::warn!(secret = %name, error = %e, "admission webhook: the Secret holds no usable certificates; making new ones");
                    Certificates::issue(&self.dns_names, now)?
                }
            };
            let version = secret.metadata.resource_version.clone();
            match self
                .secrets
                .replace(name, &PostParams::default(), &self.secret(&next, version))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %name, "admission webhook: certificates renewed");
                    return Ok(next);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(self.secret_error("update", e)),
            }
        }
        Err(WebhookError::SecretContended {
            namespace: self.config.namespace.clone(),
            name: name.clone(),
        })
    }

    fn secret(&self, certs: &Certificates, resource_version: Option<String>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(self.config.secret.clone()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_owned(),
                    MANAGED_BY.to_owned(),
                )])),
                resource_version,
                ..ObjectMeta::default()
            },
            data: Some(
                certs
                    .to_secret_data()
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v)))
                    .collect(),
            ),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        }
    }

    fn secret_error(&self, action: &'static str, source: kube::Error) -> WebhookError {
        WebhookError::Secret {
            action,
            namespace: self.config.namespace.clone(),
            name: self.config.secret.clone(),
            source,
        }
    }

    /// Writes `bundle` into every webhook of both configurations whose `caBundle` differs.
    pub async fn write_ca_bundle(&self, bundle: &str) -> Result<(), WebhookError> {
        write_ca_bundle(&self.configurations, &self.config.configuration, bundle).await?;
        write_ca_bundle(
            &self.validating_configurations,
            &self.config.validating_configuration,
            bundle,
        )
        .await
    }
}

/// A webhook configuration, mutating or validating: the `caBundle`s its webhooks carry.
pub trait WebhookConfiguration:
    kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug
{
    const KIND: &'static str;
    /// The `caBundle` of each webhook, in order.
    fn ca_bundles(&self) -> Vec<Option<&ByteString>>;
}

impl WebhookConfiguration for MutatingWebhookConfiguration {
    const KIND: &'static str = "MutatingWebhookConfiguration";
    fn ca_bundles(&self) -> Vec<Option<&ByteString>> {
        self.webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.as_ref())
            .collect()
    }
}

impl WebhookConfiguration for ValidatingWebhookConfiguration {
    const KIND: &'static str = "ValidatingWebhookConfiguration";
    fn ca_bundles(&self) -> Vec<Option<&ByteString>> {
        self.webhooks
            .iter()
            .flatten()
            .map(|w| w.client_config.ca_bundle.as_ref())
            .collect()
    }
}

/// Writes `bundle` into every webhook of configuration `name` (empty: none) whose `caBundle`
/// differs. A missing configuration is logged, not an error: the server still serves (the chart
/// may install the configuration later, or not at all).
async fn write_ca_bundle<C: WebhookConfiguration>(
    configurations: &Api<C>,
    name: &str,
    bundle: &str,
) -> Result<(), WebhookError> {
    if name.is_empty() {
        return Ok(());
    }
    let error = |action, source| WebhookError::Configuration {
        action,
        kind: C::KIND,
        name: name.to_owned(),
        source,
    };
    let Some(found) = configurations
        .get_opt(name)
        .await
        .map_err(|e| error("read", e))?
    else {
        tracing::warn!(configuration = %name, kind = C::KIND, "admission webhook: configuration not found; the API server does not call this webhook");
        return Ok(());
    };
    let Some(patch) = ca_bundle_patch(&found, bundle) else {
        return Ok(());
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match configurations
        .patch(name, &params, &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(configuration = %name, kind = C::KIND, "admission webhook: caBundle written");
            Ok(())
        }
        // Changed since it was read (the resourceVersion test failed): the next check writes it.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => Ok(()),
        Err(e) => Err(error("patch", e)),
    }
}

/// The JSON patch writing `bundle` (PEM) into each webhook of `configuration` that does not
/// trust it yet, guarded by the configuration's `resourceVersion`; `None` when all do.
pub fn ca_bundle_patch<C: WebhookConfiguration>(
    configuration: &C,
    bundle: &str,
) -> Option<json_patch::Patch> {
    let wanted = ByteString(bundle.as_bytes().to_vec());
    let mut ops = vec![json!({
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": configuration.meta().resource_version.clone().unwrap_or_default(),
    })];
    for (index, ca_bundle) in configuration.ca_bundles().into_iter().enumerate() {
        if ca_bundle != Some(&wanted) {
            ops.push(json!({
                "op": "add",
                "path": format!("/webhooks/{index}/clientConfig/caBundle"),
                "value": wanted,
            }));
        }
    }
    if ops.len() == 1 {
        return None;
    }
    serde_json::from_value(serde_json::Value::Array(ops)).ok()
}
