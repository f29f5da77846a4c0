//! The HTTP endpoints every Tessera process serves (axum):
//!
//! - `/metrics`: a Prometheus registry in the OpenMetrics text format;
//! - `/healthz`: 200 `ok` while the process works, else 503 with one line per problem (usually
//!   [`Liveness`](crate::Liveness): a loop that stopped making progress);
//! - `/readyz`: 200 `ok` once the process can do its job, else 503 with one line per reason
//!   (e.g. "the kubelet has not registered the plugin yet").
//!
//! What each endpoint reports is the process's business: it hands in a [`Probe`] for each of
//! the two checks and a [`MetricsText`] for `/metrics`. [`Reasons`] is a ready-made probe for
//! conditions that parts of the process set and clear as they come and go.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::liveness::Liveness;

/// One check of `/healthz` or `/readyz`: `Ok` when it passes, else one line per problem, each
/// saying what is wrong (and, where it helps, what to do).
pub trait Probe: Send + Sync + 'static {
    fn check(&self) -> Result<(), Vec<String>>;
}

impl<F> Probe for F
where
    F: Fn() -> Result<(), Vec<String>> + Send + Sync + 'static,
{
    fn check(&self) -> Result<(), Vec<String>> {
        self()
    }
}

impl Probe for Liveness {
    fn check(&self) -> Result<(), Vec<String>> {
        Liveness::check(self)
    }
}

/// Every probe must pass; the problems of all of them, in order.
impl Probe for Vec<Arc<dyn Probe>> {
    fn check(&self) -> Result<(), Vec<String>> {
        let problems: Vec<String> = self
            .iter()
            .filter_map(|probe| probe.check().err())
            .flatten()
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Named conditions that hold a probe back, set and cleared by the parts they concern (e.g.
/// "the API server has not answered yet" while a start is degraded). Cheap to clone; clones
/// share the conditions. Reported in the order of their names.
#[derive(Debug, Clone, Default)]
pub struct Reasons {
    reasons: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Reasons {
    /// Holds the probe back under `name`, saying `reason` (replacing an earlier one of that name).
    pub fn set(&self, name: &str, reason: impl Into<String>) {
        self.lock().insert(name.to_owned(), reason.into());
    }

    /// The condition `name` no longer holds.
    pub fn clear(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.reasons.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Probe for Reasons {
    fn check(&self) -> Result<(), Vec<String>> {
        let reasons: Vec<String> = self.lock().values().cloned().collect();
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(reasons)
        }
    }
}

/// What `/metrics` serves.
pub trait MetricsText: Send + Sync + 'static {
    /// The OpenMetrics text exposition.
    fn encode(&self) -> Result<String, std::fmt::Error>;
}

impl MetricsText for Registry {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, self)?;
        Ok(text)
    }
}

/// Everything the endpoints serve from.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<dyn MetricsText>,
    pub liveness: Arc<dyn Probe>,
    pub readiness: Arc<dyn Probe>,
}

impl Endpoints {
    /// The router with `/metrics`, `/healthz` and `/readyz`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(self)
    }
}

/// The endpoints could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The address could not be bound.
    #[error(
        "cannot listen on {address} for /metrics, /healthz and /readyz: {source}; pick another --metrics-address"
    )]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// The endpoints, bound to their address and ready to serve.
pub struct EndpointServer {
    listener: TcpListener,
    endpoints: Endpoints,
}

impl EndpointServer {
    /// Binds `address` (e.g. `0.0.0.0:8080`); the error names the address.
    pub async fn bind(
        address: SocketAddr,
        endpoints: Endpoints,
    ) -> Result<EndpointServer, EndpointError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| EndpointError::Bind { address, source })?;
        Ok(EndpointServer {
            listener,
            endpoints,
        })
    }

    /// The bound address (the port the system chose for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.endpoints.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

async fn metrics(State(endpoints): State<Endpoints>) -> Response {
    match endpoints.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode metrics: {error}\n"),
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

async fn healthz(State(endpoints): State<Endpoints>) -> Response {
    verdict(endpoints.liveness.check())
}

async fn readyz(State(endpoints): State<Endpoints>) -> Response {
    verdict(endpoints.readiness.check())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::metrics::gauge::Gauge;

    use super::*;
    use crate::liveness::Heartbeat;

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
    async fn endpoints_report_metrics_liveness_and_readiness_with_reasons() {
        let mut registry = Registry::with_prefix("test");
        let gauge = Gauge::<i64>::default();
        registry.register("devices", "Devices", gauge.clone());
        gauge.set(2);
        let mut liveness = Liveness::default();
        liveness.watch(Heartbeat::new("health monitor", Duration::ZERO));
        let reasons = Reasons::default();
        reasons.set("b-slices", "the slices have not been published yet");
        reasons.set("a-api", "the API server has not answered yet");
        let other: Arc<dyn Probe> = Arc::new(|| Ok(()));
        let readiness: Vec<Arc<dyn Probe>> = vec![other, Arc::new(reasons.clone())];
        let endpoints = Endpoints {
            metrics: Arc::new(registry),
            liveness: Arc::new(liveness),
            readiness: Arc::new(readiness),
        };
        let server = EndpointServer::bind("127.0.0.1:0".parse().unwrap(), endpoints)
            .await
            .unwrap();
        let address = server.local_addr().unwrap();
        let stop = crate::Stop::new();
        let serving = tokio::spawn(server.serve(stop.clone().cancelled_owned()));

        let (code, body) = fetch(address, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("test_devices 2"), "{body}");

        let (code, body) = fetch(address, "/readyz").await;
        assert_eq!(code, 503);
        assert_eq!(
            body,
            "the API server has not answered yet\nthe slices have not been published yet\n"
        );
        reasons.clear("a-api");
        reasons.clear("b-slices");
        assert_eq!(fetch(address, "/readyz").await, (200, "ok\n".to_owned()));

        tokio::time::sleep(Duration::from_millis(5)).await;
        let (code, body) = fetch(address, "/healthz").await;
        assert_eq!(code, 503);
        assert!(
            body.starts_with("health monitor has not made progress"),
            "{body}"
        );

        stop.cancel();
        serving.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_busy_address_is_named() {
        let endpoints = || Endpoints {
            metrics: Arc::new(Registry::default()),
            liveness: Arc::new(Liveness::default()),
            readiness: Arc::new(Reasons::default()),
        };
        let taken = EndpointServer::bind("127.0.0.1:0".parse().unwrap(), endpoints())
            .await
            .unwrap();
        let address = taken.local_addr().unwrap();
        let error = EndpointServer::bind(address, endpoints())
            .await
            .err()
            .unwrap();
        assert!(error.to_string().contains(&address.to_string()), "{error}");
    }
}
