//! The plugin's HTTP endpoints (axum):
//!
//! - `/metrics`: the Prometheus registry in the text exposition format;
//! - `/healthz`: 200 while every background loop makes progress ([`Liveness`]), else 503 naming
//!   the stuck loops;
//! - `/readyz`: 200 once claim preparation has recovered its state, the kubelet has registered
//!   the plugin and the node's ResourceSlices have been published, else 503 saying what is
//!   missing.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tessera_kubelet::RegistrationState;
use tokio::sync::watch;

use super::liveness::Liveness;

/// What `/readyz` looks at.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The kubelet's registration verdict ([`tessera_kubelet::KubeletPlugin::registration_state`]).
    pub registration: watch::Receiver<RegistrationState>,
    /// Whether the node's slices have been published at least once.
    pub published: watch::Receiver<bool>,
    /// Why claim preparation has not recovered its state yet (`None`: it has;
    /// [`crate::NodeDriver::recovery`]).
    pub recovery: watch::Receiver<Option<String>>,
}

impl Readiness {
    /// `Ok` when ready, else what is missing.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut missing = Vec::new();
        if let Some(reason) = &*self.recovery.borrow() {
            missing.push(format!(
                "claim preparation is still recovering its state (retrying): {reason}"
            ));
        }
        match &*self.registration.borrow() {
            RegistrationState::Registered => {}
            RegistrationState::Pending => {
                missing.push("the kubelet has not registered the plugin yet".to_owned());
            }
            RegistrationState::Rejected { error } => {
                missing.push(format!("the kubelet rejected the plugin: {error}"));
            }
        }
        if !*self.published.borrow() {
            missing.push("the node's ResourceSlices have not been published yet".to_owned());
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }
}

/// Everything the endpoints serve from.
#[derive(Clone)]
pub struct EndpointState {
    pub registry: Arc<Registry>,
    pub liveness: Liveness,
    pub readiness: Readiness,
}

/// The router with `/metrics`, `/healthz` and `/readyz`.
pub fn router(state: EndpointState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the endpoints on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: EndpointState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `address` (e.g. `0.0.0.0:8080`); the error names the address.
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, EndpointError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| EndpointError::Bind { address, source })
}

/// The endpoints could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The metrics address could not be bound.
    #[error(
        "cannot listen on {address} for /metrics, /healthz and /readyz: {source}; pick another --metrics-address or pass an empty one to turn the endpoints off"
    )]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

async fn metrics(State(state): State<EndpointState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {error}"),
        )
            .into_response(),
    }
}

fn verdict(result: Result<(), Vec<String>>) -> Response {
    match result {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(problems) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", problems.join("\n")),
        )
            .into_response(),
    }
}

async fn healthz(State(state): State<EndpointState>) -> Response {
    verdict(state.liveness.check())
}

async fn readyz(State(state): State<EndpointState>) -> Response {
    verdict(state.readiness.check())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::NodeMetrics;
    use crate::metrics::liveness::Heartbeat;

    async fn fetch(address: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let code = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    #[tokio::test]
    async fn endpoints_report_metrics_liveness_and_readiness() {
        let mut registry = Registry::default();
        let metrics = NodeMetrics::new(&mut registry);
        metrics.set_prepared_devices(2);
        let (registration, registration_rx) = watch::channel(RegistrationState::Pending);
        let (published, published_rx) = watch::channel(false);
        let (recovery, recovery_rx) = watch::channel(Some("LIST failed".to_owned()));
        let mut liveness = Liveness::default();
        let stuck = Heartbeat::new("health monitor", Duration::ZERO);
        liveness.watch(stuck.clone());
        let state = EndpointState {
            registry: Arc::new(registry),
            liveness,
            readiness: Readiness {
                registration: registration_rx,
                published: published_rx,
                recovery: recovery_rx,
            },
        };
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state, async {
            stopped.await.ok();
        }));

        let (code, body) = fetch(address, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("tessera_node_prepared_devices 2"), "{body}");

        let (code, body) = fetch(address, "/readyz").await;
        assert_eq!(code, 503);
        assert!(
            body.contains("not registered")
                && body.contains("not been published")
                && body.contains("still recovering its state (retrying): LIST failed"),
            "{body}"
        );
        registration.send_replace(RegistrationState::Registered);
        published.send_replace(true);
        assert_eq!(fetch(address, "/readyz").await.0, 503);
        recovery.send_replace(None);
        assert_eq!(fetch(address, "/readyz").await.0, 200);

        tokio::time::sleep(Duration::from_millis(5)).await;
        let (code, body) = fetch(address, "/healthz").await;
        assert_eq!(code, 503);
        assert!(body.contains("health monitor"), "{body}");

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_busy_address_is_named() {
        let taken = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let address = taken.local_addr().unwrap();
        let error = bind(address).await.unwrap_err();
        assert!(error.to_string().contains(&address.to_string()));
    }
}
