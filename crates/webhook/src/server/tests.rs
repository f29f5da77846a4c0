use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::*;
use crate::certificates::{Certificates, service_dns_names};

const NOW: i64 = 1_790_000_000;

fn names() -> Vec<String> {
    service_dns_names("tessera-webhook", "tessera-system")
}

/// Refuses pods named `refused`, patches pods named `patched`, allows the rest unchanged.
struct ByName;

impl Review for ByName {
    fn name(&self) -> &'static str {
        "by-name"
    }

    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse {
        match request.name.as_deref() {
            Some("refused") => AdmissionResponse::deny(&request.uid, 403, "no".into()),
            Some("patched") => AdmissionResponse {
                patch_type: Some("JSONPatch".into()),
                patch: Some("W10=".into()),
                ..AdmissionResponse::allow(&request.uid)
            },
            _ => AdmissionResponse::allow(&request.uid),
        }
    }
}

fn review(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{name}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "team-a",
            "name": name,
            "operation": "CREATE",
            "object": {}
        }
    })
    .to_string()
}

struct Served {
    address: SocketAddr,
    certificate: Arc<ServingCertificate>,
    reviews: Reviews,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), WebhookServerError>>,
}

async fn serve(certs: &Certificates) -> Served {
    let certificate = Arc::new(ServingCertificate::default());
    certificate.load(&certs.cert, &certs.key).unwrap();
    let reviews = Reviews::default();
    let server = WebhookServer::new(reviews.clone()).route("/by-name", Arc::new(ByName));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (address, serving) = server
        .bind("127.0.0.1:0".parse().unwrap(), certificate.clone(), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    Served {
        address,
        certificate,
        reviews,
        stop,
        task: tokio::spawn(serving),
    }
}

/// POSTs `body` to `path` over TLS trusting `bundle` for the Service's name; the status code and
/// body, or the TLS error.
async fn post(
    address: SocketAddr,
    bundle: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), std::io::Error> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(address).await?;
    let name = ServerName::try_from(names()[0].clone()).unwrap();
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        names()[0],
        body.len()
    );
    tls.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

fn counted(reviews: &Reviews, result: &str) -> u64 {
    reviews
        .get_or_create(&ReviewLabel {
            webhook: "by-name".into(),
            result: result.into(),
        })
        .get()
}

#[tokio::test]
async fn reviews_are_answered_over_tls_and_counted() {
    let certs = Certificates::issue(&names(), NOW).unwrap();
    let served = serve(&certs).await;
    let bundle = &certs.ca_bundle;

    let (status, body) = post(served.address, bundle, "/by-name", &review("patched"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "uid-patched");
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["patchType"], "JSONPatch");

    let (_, body) = post(served.address, bundle, "/by-name", &review("refused"))
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 403);
    post(served.address, bundle, "/by-name", &review("plain"))
        .await
        .unwrap();

    let (status, body) = post(served.address, bundle, "/by-name", "{}")
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("not an AdmissionReview"), "{body}");
    let (status, _) = post(served.address, bundle, "/elsewhere", &review("plain"))
        .await
        .unwrap();
    assert_eq!(status, 404);

    for (result, n) in [
        ("patched", 1),
        ("refused", 1),
        ("allowed", 1),
        ("bad-request", 1),
    ] {
        assert_eq!(counted(&served.reviews, result), n, "{result}");
    }
    served.stop.send(()).unwrap();
    served.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_replaced_certificate_serves_new_connections() {
    let first = Certificates::issue(&names(), NOW).unwrap();
    let served = serve(&first).await;
    assert!(served.certificate.is_loaded());
    let second = Certificates::issue(&names(), NOW).unwrap();
    let refused = post(served.address, &second.ca_bundle, "/by-name", &review("x")).await;
    assert!(refused.is_err(), "another CA's clients do not trust it yet");

    served.certificate.load(&second.cert, &second.key).unwrap();
    let (status, _) = post(served.address, &second.ca_bundle, "/by-name", &review("x"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        post(served.address, &first.ca_bundle, "/by-name", &review("x"))
            .await
            .is_err(),
        "the old certificate is no longer presented"
    );
    served.stop.send(()).unwrap();
    served.task.await.unwrap().unwrap();
}

#[test]
fn what_is_not_a_certificate_is_refused_with_the_reason() {
    let certificate = ServingCertificate::default();
    assert!(!certificate.is_loaded());
    assert!(matches!(
        certificate.load("", ""),
        Err(WebhookServerError::NoCertificate)
    ));
    let certs = Certificates::issue(&names(), NOW).unwrap();
    assert!(matches!(
        certificate.load(&certs.cert, "not a key"),
        Err(WebhookServerError::Certificate(_))
    ));
    assert!(!certificate.is_loaded());
}
