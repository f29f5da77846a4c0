//! The admission webhook's certificates against the API-server fake: the first replica makes them
//! and keeps them in the Secret, another replica serves the same ones, the webhook
//! configuration's `caBundle` is written (and written again after a `helm upgrade` emptied it),
//! and a Secret that holds no usable certificates is replaced.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_controller::webhook::{Keeper, WebhookConfig, ca_bundle_patch};
use tessera_fake_apiserver::FakeApiServer;
use tessera_webhook::certificates::Certificates;
use tessera_webhook::server::ServingCertificate;

const NAMESPACE: &str = "tessera-system";

fn config() -> WebhookConfig {
    WebhookConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        namespace: NAMESPACE.into(),
        service: "tessera-webhook".into(),
        secret: "tessera-webhook-certificates".into(),
        configuration: "tessera-device-plugin-conversion".into(),
        validating_configuration: String::new(),
    }
}

/// The chart's configuration: two webhooks, no `caBundle` yet.
fn configuration() -> MutatingWebhookConfiguration {
    let webhook = |name: &str| MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        client_config: WebhookClientConfig::default(),
        ..MutatingWebhook::default()
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(config().configuration),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            webhook("pods.convert.gpu.tessera.dev"),
            webhook("other.gpu.tessera.dev"),
        ]),
    }
}

fn bundles(api: &FakeApiServer) -> Vec<Option<String>> {
    let found = api
        .get::<MutatingWebhookConfiguration>(None, &config().configuration)
        .unwrap();
    found
        .webhooks
        .unwrap()
        .iter()
        .map(|w| {
            w.client_config
                .ca_bundle
                .as_ref()
                .map(|b| String::from_utf8(b.0.clone()).unwrap())
        })
        .collect()
}

fn stored(api: &FakeApiServer) -> Certificates {
    let secret = api
        .get::<Secret>(Some(NAMESPACE), &config().secret)
        .unwrap();
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    Certificates::from_secret_data(&data).unwrap()
}

#[tokio::test]
async fn the_first_replica_makes_the_certificates_and_the_others_serve_the_same() {
    let api = FakeApiServer::new();
    api.seed(&configuration());
    let first = Keeper::new(api.client(), &config());
    let serving = ServingCertificate::default();
    let made = first.keep(&serving).await.unwrap();
    assert!(serving.is_loaded());
    assert_eq!(stored(&api), made);
    assert_eq!(
        made.dns_names,
        [
            "tessera-webhook.tessera-system.svc",
            "tessera-webhook.tessera-system.svc.cluster.local",
            "tessera-webhook.tessera-system"
        ]
    );
    assert_eq!(
        bundles(&api),
        [Some(made.ca_bundle.clone()), Some(made.ca_bundle.clone())]
    );

    let second = Keeper::new(api.client(), &config());
    assert_eq!(
        second.keep(&ServingCertificate::default()).await.unwrap(),
        made
    );
    assert_eq!(stored(&api), made, "nothing renewed");

    // A `helm upgrade` puts the chart's configuration back, without the bundle.
    api.seed(&configuration());
    assert_eq!(bundles(&api), [None, None]);
    second.keep(&serving).await.unwrap();
    assert_eq!(
        bundles(&api),
        [Some(made.ca_bundle.clone()), Some(made.ca_bundle)]
    );
}

#[tokio::test]
async fn a_secret_without_usable_certificates_is_replaced_and_a_missing_configuration_is_no_error()
{
    let api = FakeApiServer::new();
    api.seed(&Secret {
        metadata: ObjectMeta {
            name: Some(config().secret),
            namespace: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "tls.crt".to_owned(),
            ByteString(b"garbage".to_vec()),
        )])),
        ..Secret::default()
    });
    let keeper = Keeper::new(api.client(), &config());
    let made = keeper.keep(&ServingCertificate::default()).await.unwrap();
    assert_eq!(stored(&api), made);
}

#[test]
fn the_bundle_patch_touches_only_webhooks_that_lack_it_and_tests_the_version() {
    let mut found = configuration();
    found.metadata.resource_version = Some("42".into());
    found.webhooks.as_mut().unwrap()[1].client_config.ca_bundle = Some(ByteString(b"PEM".to_vec()));
    let patch = serde_json::to_value(ca_bundle_patch(&found, "PEM").unwrap()).unwrap();
    assert_eq!(
        patch,
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
            {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "UEVN"}
        ])
    );
    found.webhooks.as_mut().unwrap()[0].client_config.ca_bundle = Some(ByteString(b"PEM".to_vec()));
    assert_eq!(ca_bundle_patch(&found, "PEM"), None);
}

#[tokio::test]
async fn the_validating_configuration_gets_the_bundle_too_and_an_unnamed_one_is_left_alone() {
    let api = FakeApiServer::new();
    let name = "tessera-webhook";
    api.seed(&ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "claim-configs.gpu.tessera.dev".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            client_config: WebhookClientConfig::default(),
            ..ValidatingWebhook::default()
        }]),
    });
    // The conversion is off: no MutatingWebhookConfiguration is named (or exists).
    let only_validating = WebhookConfig {
        configuration: String::new(),
        validating_configuration: name.into(),
        ..config()
    };
    let made = Keeper::new(api.client(), &only_validating)
        .keep(&ServingCertificate::default())
        .await
        .unwrap();
    let found = api
        .get::<ValidatingWebhookConfiguration>(None, name)
        .unwrap();
    assert_eq!(
        found.webhooks.unwrap()[0].client_config.ca_bundle,
        Some(ByteString(made.ca_bundle.into_bytes()))
    );
    assert!(
        api.get::<MutatingWebhookConfiguration>(None, &config().configuration)
            .is_none()
    );
}
