//! The device health stream (`v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth`), fed
//! by the driver's health watch channel.
//!
//! Each `NodeWatchResources` stream sends the driver's current device list at once and then
//! every new list. It ends when the plugin shuts down or the driver drops its sender.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use crate::driver::{DeviceHealth, HealthStatus};
use crate::proto::{health_v1, health_v1alpha1};
use crate::stop::StopSignal;

/// A boxed server stream of health responses.
type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// What both health service versions share: the driver's channel and the plugin's stop signal.
#[derive(Clone)]
pub(crate) struct HealthFeed {
    pub(crate) updates: watch::Receiver<Vec<DeviceHealth>>,
    pub(crate) stop: StopSignal,
}

impl HealthFeed {
    fn stream<T: Send + 'static>(
        &self,
        version: &'static str,
        convert: fn(&[DeviceHealth]) -> T,
    ) -> HealthStream<T> {
        tracing::info!(version, "kubelet opened a device health stream");
        let open = OpenStreamLog { version };
        let updates = WatchStream::new(self.updates.clone())
            .map(move |devices| {
                let _open = &open;
                Ok(convert(&devices))
            })
            .take_until(self.stop.clone().stopped());
        Box::pin(updates)
    }
}

/// Logs when a health stream goes away (plugin stop, driver gone, or kubelet hung up).
struct OpenStreamLog {
    version: &'static str,
}

impl Drop for OpenStreamLog {
    fn drop(&mut self) {
        tracing::info!(version = self.version, "device health stream closed");
    }
}

/// Seconds since the Unix epoch; zero for times before it.
fn unix_seconds(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Whole seconds of a timeout; zero (the kubelet's default) for none.
fn timeout_seconds(timeout: Option<Duration>) -> i64 {
    timeout.map_or(0, |timeout| {
        i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX)
    })
}

fn response_v1(devices: &[DeviceHealth]) -> health_v1::NodeWatchResourcesResponse {
    let devices = devices
        .iter()
        .map(|device| health_v1::DeviceHealth {
            device: Some(health_v1::DeviceIdentifier {
                pool_name: device.pool_name.clone(),
                device_name: device.device_name.clone(),
            }),
            health: match device.status {
                HealthStatus::Unknown => health_v1::HealthStatus::Unknown,
                HealthStatus::Healthy => health_v1::HealthStatus::Healthy,
                HealthStatus::Unhealthy => health_v1::HealthStatus::Unhealthy,
            }
            .into(),
            last_updated_time: unix_seconds(device.last_updated),
            health_check_timeout_seconds: timeout_seconds(device.health_check_timeout),
            message: device.message.clone(),
        })
        .collect();
    health_v1::NodeWatchResourcesResponse { devices }
}

fn response_v1alpha1(devices: &[DeviceHealth]) -> health_v1alpha1::NodeWatchResourcesResponse {
    let devices = devices
        .iter()
        .map(|device| health_v1alpha1::DeviceHealth {
            device: Some(health_v1alpha1::DeviceIdentifier {
                pool_name: device.pool_name.clone(),
                device_name: device.device_name.clone(),
            }),
            health: match device.status {
                HealthStatus::Unknown => health_v1alpha1::HealthStatus::Unknown,
                HealthStatus::Healthy => health_v1alpha1::HealthStatus::Healthy,
                HealthStatus::Unhealthy => health_v1alpha1::HealthStatus::Unhealthy,
            }
            .into(),
            last_updated_time: unix_seconds(device.last_updated),
            health_check_timeout_seconds: timeout_seconds(device.health_check_timeout),
            message: device.message.clone(),
        })
        .collect();
    health_v1alpha1::NodeWatchResourcesResponse { devices }
}

/// `v1.DRAResourceHealth`.
pub(crate) struct HealthV1Service(pub(crate) HealthFeed);

/// `v1alpha1.DRAResourceHealth`.
pub(crate) struct HealthV1alpha1Service(pub(crate) HealthFeed);

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for HealthV1Service {
    type NodeWatchResourcesStream = HealthStream<health_v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.0.stream("v1", response_v1)))
    }
}

#[tonic::async_trait]
impl health_v1alpha1::dra_resource_health_server::DraResourceHealth for HealthV1alpha1Service {
    type NodeWatchResourcesStream = HealthStream<health_v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<health_v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.0.stream("v1alpha1", response_v1alpha1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_converts_with_second_resolution_and_default_timeout() {
        let device = DeviceHealth {
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            status: HealthStatus::Unhealthy,
            last_updated: UNIX_EPOCH + Duration::from_millis(1_700_000_000_900),
            health_check_timeout: None,
            message: "XID 79".into(),
        };
        let response = response_v1(std::slice::from_ref(&device));
        let sent = &response.devices[0];
        assert_eq!(sent.last_updated_time, 1_700_000_000);
        assert_eq!(sent.health_check_timeout_seconds, 0);
        assert_eq!(sent.health(), health_v1::HealthStatus::Unhealthy);
        assert_eq!(sent.device.as_ref().unwrap().device_name, "gpu-0");

        let before_epoch = DeviceHealth {
            last_updated: UNIX_EPOCH - Duration::from_secs(5),
            health_check_timeout: Some(Duration::from_secs(30)),
            ..device
        };
        let sent = &response_v1alpha1(&[before_epoch]).devices[0];
        assert_eq!(sent.last_updated_time, 0);
        assert_eq!(sent.health_check_timeout_seconds, 30);
        assert_eq!(sent.message, "XID 79");
    }
}
