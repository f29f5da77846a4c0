//! The HTTPS server the API server calls: one path per webhook, each a [`Review`] that answers an
//! AdmissionReview (the device-plugin conversion today; a validating webhook is one more path on
//! the same server, certificates and Service). The serving certificate can be replaced while the
//! server runs ([`ServingCertificate::load`]): new connections get the new one.
//!
//! TLS handshakes run in tasks of their own, so a slow or stuck client delays nobody; finished
//! connections are handed to axum.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tessera_admission::review::{AdmissionRequest, AdmissionResponse, parse_request, review_of};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// The largest AdmissionReview accepted: a pod may be up to the API server's 3 MiB request
/// limit, and an UPDATE review carries the old object too.
pub const MAX_REVIEW_BYTES: usize = 8 << 20;
/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the HTTP server.
const ACCEPTED_QUEUE: usize = 64;

/// One webhook: what it answers for an admission request.
pub trait Review: Send + Sync + 'static {
    /// The webhook's name in metrics and logs (`device-plugin-conversion`).
    fn name(&self) -> &'static str;
    /// The answer to `request`.
    fn review(&self, request: &AdmissionRequest) -> AdmissionResponse;
}

/// The labels of [`Reviews`]: the webhook and how its answer ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabel {
    pub webhook: String,
    /// `patched` (allowed with a patch), `allowed` (unchanged), `refused`, or `bad-request` (the
    /// body was no AdmissionReview).
    pub result: String,
}

/// Answers counted per webhook and result.
pub type Reviews = Family<ReviewLabel, Counter>;

/// Failures to start serving.
#[derive(Debug, thiserror::Error)]
pub enum WebhookServerError {
    #[error("the webhook's serving certificate is not PEM: {0}")]
    Certificate(rustls_pki_types::pem::Error),
    #[error("the webhook's serving certificate has no certificate in it")]
    NoCertificate,
    #[error("the webhook's serving key cannot be used: {0}")]
    Key(rustls::Error),
    #[error("cannot listen on {address} for the admission webhook: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("the admission webhook's server failed: {0}")]
    Serve(std::io::Error),
}

/// The certificate the server presents, replaceable while it runs.
#[derive(Debug, Default)]
pub struct ServingCertificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingCertificate {
    /// Presents `cert` (PEM, the serving certificate first) with `key` (PEM) from now on.
    pub fn load(&self, cert: &str, key: &str) -> Result<(), WebhookServerError> {
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(WebhookServerError::Certificate)?;
        if chain.is_empty() {
            return Err(WebhookServerError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(WebhookServerError::Certificate)?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(WebhookServerError::Key)?;
        let certified = Arc::new(CertifiedKey::new(chain, signer));
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(certified);
        Ok(())
    }

    /// Whether a certificate was loaded.
    pub fn is_loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The webhooks by path (`/convert-device-plugin-pods`).
pub struct WebhookServer {
    routes: BTreeMap<String, Arc<dyn Review>>,
    reviews: Reviews,
}

impl WebhookServer {
    /// A server without webhooks, counting its answers in `reviews`.
    pub fn new(reviews: Reviews) -> WebhookServer {
        WebhookServer {
            routes: BTreeMap::new(),
            reviews,
        }
    }

    /// Serves `review` at `path`.
    pub fn route(mut self, path: &str, review: Arc<dyn Review>) -> WebhookServer {
        self.routes.insert(path.to_owned(), review);
        self
    }

    /// The HTTP routes (no TLS): what [`WebhookServer::serve`] serves over TLS.
    pub fn router(&self) -> Router {
        let mut router = Router::new();
        for (path, review) in &self.routes {
            let state = Answering {
                review: review.clone(),
                reviews: self.reviews.clone(),
            };
            router = router.route(path, post(answer).with_state(state));
        }
        router.layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
    }

    /// Binds `address` (port 0: any) and returns the bound address with the future that serves
    /// over TLS with `certificate` until `stop` completes.
    pub async fn bind(
        self,
        address: SocketAddr,
        certificate: Arc<ServingCertificate>,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<
        (
            SocketAddr,
            impl Future<Output = Result<(), WebhookServerError>>,
        ),
        WebhookServerError,
    > {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| WebhookServerError::Bind { address, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| WebhookServerError::Bind { address, source })?;
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(WebhookServerError::Key)?
                .with_no_client_auth()
                .with_cert_resolver(certificate);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let router = self.router();
        let serve = async move {
            let (accepted, incoming) = mpsc::channel(ACCEPTED_QUEUE);
            let acceptor = tokio::spawn(handshakes(
                listener,
                TlsAcceptor::from(Arc::new(config)),
                accepted,
            ));
            let tls = TlsListener { incoming, local };
            let served = axum::serve(tls, router)
                .with_graceful_shutdown(stop)
                .await
                .map_err(WebhookServerError::Serve);
            acceptor.abort();
            served
        };
        Ok((local, serve))
    }
}

/// What one path's handler answers with.
#[derive(Clone)]
struct Answering {
    review: Arc<dyn Review>,
    reviews: Reviews,
}

async fn answer(State(answering): State<Answering>, body: Bytes) -> Response {
    let webhook = answering.review.name();
    let count = |result: &str| {
        answering
            .reviews
            .get_or_create(&ReviewLabel {
                webhook: webhook.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    };
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(e) => {
            count("bad-request");
            tracing::warn!(webhook, error = %e, "admission webhook: request refused");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    let response = answering.review.review(&request);
    count(if !response.allowed {
        "refused"
    } else if response.patch.is_some() {
        "patched"
    } else {
        "allowed"
    });
    let body = serde_json::to_vec(&review_of(&response)).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Accepts TCP connections and hands each one's TLS handshake to a task of its own; finished
/// handshakes go to `accepted`.
async fn handshakes(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    accepted: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(connection) => connection,
            Err(e) => {
                tracing::debug!(error = %e, "admission webhook: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let accepted = accepted.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = accepted.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "admission webhook: TLS handshake failed")
                }
                Err(_) => tracing::debug!(%peer, "admission webhook: TLS handshake timed out"),
            }
        });
    }
}

/// The connections whose TLS handshake finished, as axum takes them.
struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accepting task ended (it never does while serving): wait for the shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests;
