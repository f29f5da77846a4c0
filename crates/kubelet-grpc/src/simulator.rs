//! A kubelet simulator: the client half of the kubelet's DRA plugin handling, over real unix
//! sockets, for tests of this crate and of the node plugin.
//!
//! It does what the kubelet does: `GetInfo` on the registration socket, checks the answer,
//! picks the newest DRA and health services offered, reports `NotifyRegistrationStatus`, then
//! calls the DRA socket with `:authority` `localhost`, treating a response that lacks a
//! requested claim as an error.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tessera_kubelet_grpc::simulator::SimulatorError> {
//! use tessera_kubelet_grpc::{ClaimRef, simulator::KubeletSimulator};
//! let kubelet = KubeletSimulator::register(
//!     "/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock".as_ref(),
//! ).await?;
//! let claim = ClaimRef::new("default", "gpu-claim", "8d4f3c2e-0000-4000-8000-000000000001");
//! let prepared = kubelet.prepare(&[claim]).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::driver::{
    ClaimRef, ClaimUid, DeviceHealth, HealthStatus, PrepareResult, PreparedDevice, UnprepareResult,
};
use crate::proto::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration as reg_pb};
use crate::registration::{
    DRA_PLUGIN_V1, DRA_PLUGIN_V1BETA1, DRA_RESOURCE_HEALTH_V1, DRA_RESOURCE_HEALTH_V1ALPHA1,
    PLUGIN_TYPE_DRA,
};

/// Failures of the simulated kubelet.
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    /// The socket could not be connected.
    #[error("cannot connect to unix socket {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The underlying error.
        source: tonic::transport::Error,
    },
    /// A call returned a gRPC error status.
    #[error("{method} failed: {status}")]
    Call {
        /// The gRPC method.
        method: &'static str,
        /// The status the plugin returned.
        status: tonic::Status,
    },
    /// The plugin's `GetInfo` answer is one the kubelet rejects; the simulator reported the
    /// rejection to the plugin with `NotifyRegistrationStatus`.
    #[error("the kubelet would reject this plugin: {reason}")]
    Rejected {
        /// Why.
        reason: String,
    },
    /// A response lacks entries for requested claims (the kubelet retries those).
    #[error("{method} returned no result for claims {uids:?}")]
    MissingResults {
        /// The gRPC method.
        method: &'static str,
        /// The UIDs without an entry.
        uids: Vec<String>,
    },
    /// The health service was asked for, but the plugin does not advertise one.
    #[error("the plugin does not advertise a DRAResourceHealth service")]
    NoHealthService,
}

/// A version of the DRA service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraApiVersion {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

/// A version of the health service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthApiVersion {
    /// `v1.DRAResourceHealth`.
    V1,
    /// `v1alpha1.DRAResourceHealth`.
    V1alpha1,
}

/// Connects to a unix socket the way the kubelet does (`:authority` is `localhost`).
pub async fn connect_unix(path: &Path) -> Result<Channel, SimulatorError> {
    let connect_error = |source| SimulatorError::Connect {
        path: path.to_owned(),
        source,
    };
    Endpoint::from_shared(format!("unix://{}", path.display()))
        .map_err(connect_error)?
        .origin(Uri::from_static("http://localhost"))
        .connect()
        .await
        .map_err(connect_error)
}

/// Asks the plugin behind `registration_socket` for its `PluginInfo`.
pub async fn get_info(registration_socket: &Path) -> Result<reg_pb::PluginInfo, SimulatorError> {
    let mut client = reg_pb::registration_client::RegistrationClient::new(
        connect_unix(registration_socket).await?,
    );
    client
        .get_info(reg_pb::InfoRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| SimulatorError::Call {
            method: "GetInfo",
            status,
        })
}

/// Sends a registration verdict to the plugin behind `registration_socket`.
pub async fn notify_registration_status(
    registration_socket: &Path,
    registered: bool,
    error: &str,
) -> Result<(), SimulatorError> {
    let mut client = reg_pb::registration_client::RegistrationClient::new(
        connect_unix(registration_socket).await?,
    );
    client
        .notify_registration_status(reg_pb::RegistrationStatus {
            plugin_registered: registered,
            error: error.to_owned(),
        })
        .await
        .map(drop)
        .map_err(|status| SimulatorError::Call {
            method: "NotifyRegistrationStatus",
            status,
        })
}

/// Checks `GetInfo` as the kubelet does and picks the services it would use.
fn choose_services(
    info: &reg_pb::PluginInfo,
) -> Result<(DraApiVersion, Option<HealthApiVersion>), String> {
    if info.r#type != PLUGIN_TYPE_DRA {
        return Err(format!(
            "plugin type is {:?}, not {PLUGIN_TYPE_DRA:?}",
            info.r#type
        ));
    }
    if info.name.is_empty() {
        return Err("plugin name (the driver name) is empty".to_owned());
    }
    if !Path::new(&info.endpoint).is_absolute() {
        return Err(format!(
            "endpoint {:?} is not an absolute socket path",
            info.endpoint
        ));
    }
    let offers = |service: &str| {
        info.supported_versions
            .iter()
            .any(|offered| offered == service)
    };
    let dra = if offers(DRA_PLUGIN_V1) {
        DraApiVersion::V1
    } else if offers(DRA_PLUGIN_V1BETA1) {
        DraApiVersion::V1beta1
    } else {
        return Err(format!(
            "none of the supported versions {:?} is a DRA service this kubelet speaks",
            info.supported_versions
        ));
    };
    let health = if offers(DRA_RESOURCE_HEALTH_V1) {
        Some(HealthApiVersion::V1)
    } else if offers(DRA_RESOURCE_HEALTH_V1ALPHA1) {
        Some(HealthApiVersion::V1alpha1)
    } else {
        None
    };
    Ok((dra, health))
}

/// A kubelet that has registered one DRA plugin.
#[derive(Clone, Debug)]
pub struct KubeletSimulator {
    info: reg_pb::PluginInfo,
    dra_version: DraApiVersion,
    health_version: Option<HealthApiVersion>,
    dra: Channel,
}

/// The claims of a request in one DRA version's message type.
macro_rules! wire_claims {
    ($proto:ident, $claims:expr) => {
        $claims
            .iter()
            .map(|c| $proto::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.to_string(),
                name: c.name.clone(),
            })
            .collect()
    };
}

/// Runs `$body` with `$proto` naming the chosen DRA version's generated module and `$device_from`
/// its device conversion: the versions' messages differ only in their package (and v1beta1 lacking
/// a share id), so each call is written once for both.
macro_rules! per_dra_version {
    ($version:expr, $proto:ident, $device_from:ident => $body:expr) => {
        match $version {
            DraApiVersion::V1 => {
                use dra_v1 as $proto;
                let $device_from = device_from_v1;
                $body
            }
            DraApiVersion::V1beta1 => {
                use dra_v1beta1 as $proto;
                let $device_from = device_from_v1beta1;
                $body
            }
        }
    };
}

impl KubeletSimulator {
    /// Registers the plugin behind `registration_socket`: `GetInfo`, the kubelet's checks,
    /// `NotifyRegistrationStatus` (a rejection is reported to the plugin and returned as
    /// [`SimulatorError::Rejected`]), and a connection to the DRA endpoint.
    pub async fn register(registration_socket: &Path) -> Result<Self, SimulatorError> {
        let info = get_info(registration_socket).await?;
        let (dra_version, health_version) = match choose_services(&info) {
            Ok(chosen) => chosen,
            Err(reason) => {
                notify_registration_status(registration_socket, false, &reason).await?;
                return Err(SimulatorError::Rejected { reason });
            }
        };
        let dra = connect_unix(Path::new(&info.endpoint)).await?;
        notify_registration_status(registration_socket, true, "").await?;
        Ok(Self {
            info,
            dra_version,
            health_version,
            dra,
        })
    }

    /// The plugin's `GetInfo` answer.
    pub fn info(&self) -> &reg_pb::PluginInfo {
        &self.info
    }

    /// The DRA service version the kubelet chose (the newest offered).
    pub fn dra_version(&self) -> DraApiVersion {
        self.dra_version
    }

    /// The health service version the kubelet chose, if the plugin offers one.
    pub fn health_version(&self) -> Option<HealthApiVersion> {
        self.health_version
    }

    /// The connection to the DRA socket, for raw calls through the generated clients in
    /// [`crate::proto`].
    pub fn dra_channel(&self) -> Channel {
        self.dra.clone()
    }

    /// `NodePrepareResources` over the chosen DRA version.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<ClaimUid, PrepareResult>, SimulatorError> {
        self.prepare_with(self.dra_version, claims).await
    }

    /// `NodeUnprepareResources` over the chosen DRA version.
    pub async fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<ClaimUid, UnprepareResult>, SimulatorError> {
        self.unprepare_with(self.dra_version, claims).await
    }

    /// `NodePrepareResources` over the given DRA version.
    pub async fn prepare_with(
        &self,
        version: DraApiVersion,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<ClaimUid, PrepareResult>, SimulatorError> {
        const METHOD: &str = "NodePrepareResources";
        let call_error = |status| SimulatorError::Call {
            method: METHOD,
            status,
        };
        let results: BTreeMap<ClaimUid, PrepareResult> = per_dra_version!(version, proto, device_from => {
            let request = proto::NodePrepareResourcesRequest {
                claims: wire_claims!(proto, claims),
            };
            let mut client = proto::dra_plugin_client::DraPluginClient::new(self.dra.clone());
            let response = client.node_prepare_resources(request).await.map_err(call_error)?;
            response
                .into_inner()
                .claims
                .into_iter()
                .map(|(uid, claim)| {
                    let devices = claim.devices.into_iter().map(device_from).collect();
                    (ClaimUid::new(uid), outcome(claim.error, devices))
                })
                .collect()
        });
        require_all(METHOD, claims, results)
    }

    /// `NodeUnprepareResources` over the given DRA version.
    pub async fn unprepare_with(
        &self,
        version: DraApiVersion,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<ClaimUid, UnprepareResult>, SimulatorError> {
        const METHOD: &str = "NodeUnprepareResources";
        let call_error = |status| SimulatorError::Call {
            method: METHOD,
            status,
        };
        let results: BTreeMap<ClaimUid, UnprepareResult> = per_dra_version!(version, proto, _device_from => {
            let request = proto::NodeUnprepareResourcesRequest {
                claims: wire_claims!(proto, claims),
            };
            let mut client = proto::dra_plugin_client::DraPluginClient::new(self.dra.clone());
            let response = client.node_unprepare_resources(request).await.map_err(call_error)?;
            response
                .into_inner()
                .claims
                .into_iter()
                .map(|(uid, claim)| (ClaimUid::new(uid), outcome(claim.error, ())))
                .collect()
        });
        require_all(METHOD, claims, results)
    }

    /// Opens the health stream over the chosen health version.
    pub async fn watch_health(&self) -> Result<HealthWatch, SimulatorError> {
        let version = self.health_version.ok_or(SimulatorError::NoHealthService)?;
        self.watch_health_with(version).await
    }

    /// Opens the health stream over the given health version.
    pub async fn watch_health_with(
        &self,
        version: HealthApiVersion,
    ) -> Result<HealthWatch, SimulatorError> {
        const METHOD: &str = "NodeWatchResources";
        let call_error = |status| SimulatorError::Call {
            method: METHOD,
            status,
        };
        let updates: HealthUpdates = match version {
            HealthApiVersion::V1 => {
                let mut client =
                    health_v1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.dra.clone(),
                    );
                let stream = client
                    .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                    .await
                    .map_err(call_error)?
                    .into_inner();
                Box::pin(stream.map(|response| {
                    response
                        .map(|response| response.devices.into_iter().map(health_from_v1).collect())
                }))
            }
            HealthApiVersion::V1alpha1 => {
                let mut client =
                    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.dra.clone(),
                    );
                let stream = client
                    .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
                    .await
                    .map_err(call_error)?
                    .into_inner();
                Box::pin(stream.map(|response| {
                    response.map(|response| {
                        response
                            .devices
                            .into_iter()
                            .map(health_from_v1alpha1)
                            .collect()
                    })
                }))
            }
        };
        Ok(HealthWatch { updates })
    }
}

type HealthUpdates = Pin<Box<dyn Stream<Item = Result<Vec<DeviceHealth>, tonic::Status>> + Send>>;

/// An open health stream.
pub struct HealthWatch {
    updates: HealthUpdates,
}

impl std::fmt::Debug for HealthWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthWatch").finish_non_exhaustive()
    }
}

impl HealthWatch {
    /// The next complete device list; `None` when the plugin ended the stream.
    pub async fn next(&mut self) -> Option<Result<Vec<DeviceHealth>, SimulatorError>> {
        self.updates.next().await.map(|update| {
            update.map_err(|status| SimulatorError::Call {
                method: "NodeWatchResources",
                status,
            })
        })
    }
}

fn require_all<T>(
    method: &'static str,
    claims: &[ClaimRef],
    results: BTreeMap<ClaimUid, T>,
) -> Result<BTreeMap<ClaimUid, T>, SimulatorError> {
    let missing: Vec<String> = claims
        .iter()
        .filter(|claim| !results.contains_key(&claim.uid))
        .map(|claim| claim.uid.to_string())
        .collect();
    if missing.is_empty() {
        Ok(results)
    } else {
        Err(SimulatorError::MissingResults {
            method,
            uids: missing,
        })
    }
}

fn outcome<T>(error: String, value: T) -> Result<T, String> {
    if error.is_empty() {
        Ok(value)
    } else {
        Err(error)
    }
}

fn device_from_v1(device: dra_v1::Device) -> PreparedDevice {
    PreparedDevice {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: device.share_id,
    }
}

fn device_from_v1beta1(device: dra_v1beta1::Device) -> PreparedDevice {
    PreparedDevice {
        request_names: device.request_names,
        pool_name: device.pool_name,
        device_name: device.device_name,
        cdi_device_ids: device.cdi_device_ids,
        share_id: None,
    }
}

fn time_from_unix_seconds(seconds: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

fn timeout_from_seconds(seconds: i64) -> Option<Duration> {
    u64::try_from(seconds)
        .ok()
        .filter(|&seconds| seconds > 0)
        .map(Duration::from_secs)
}

fn health_from_v1(device: health_v1::DeviceHealth) -> DeviceHealth {
    let status = match device.health() {
        health_v1::HealthStatus::Unknown => HealthStatus::Unknown,
        health_v1::HealthStatus::Healthy => HealthStatus::Healthy,
        health_v1::HealthStatus::Unhealthy => HealthStatus::Unhealthy,
    };
    let id = device.device.unwrap_or_default();
    DeviceHealth {
        pool_name: id.pool_name,
        device_name: id.device_name,
        status,
        last_updated: time_from_unix_seconds(device.last_updated_time),
        health_check_timeout: timeout_from_seconds(device.health_check_timeout_seconds),
        message: device.message,
    }
}

fn health_from_v1alpha1(device: health_v1alpha1::DeviceHealth) -> DeviceHealth {
    let status = match device.health() {
        health_v1alpha1::HealthStatus::Unknown => HealthStatus::Unknown,
        health_v1alpha1::HealthStatus::Healthy => HealthStatus::Healthy,
        health_v1alpha1::HealthStatus::Unhealthy => HealthStatus::Unhealthy,
    };
    let id = device.device.unwrap_or_default();
    DeviceHealth {
        pool_name: id.pool_name,
        device_name: id.device_name,
        status,
        last_updated: time_from_unix_seconds(device.last_updated_time),
        health_check_timeout: timeout_from_seconds(device.health_check_timeout_seconds),
        message: device.message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(services: &[&str]) -> reg_pb::PluginInfo {
        reg_pb::PluginInfo {
            r#type: PLUGIN_TYPE_DRA.into(),
            name: "gpu.tessera.dev".into(),
            endpoint: "/var/lib/kubelet/plugins/gpu.tessera.dev/dra.sock".into(),
            supported_versions: services.iter().map(|&s| s.to_owned()).collect(),
        }
    }

    #[test]
    fn the_newest_offered_services_are_chosen_whatever_their_order() {
        let chosen = choose_services(&info(&[
            DRA_PLUGIN_V1BETA1,
            DRA_RESOURCE_HEALTH_V1ALPHA1,
            DRA_PLUGIN_V1,
            DRA_RESOURCE_HEALTH_V1,
        ]));
        assert_eq!(chosen, Ok((DraApiVersion::V1, Some(HealthApiVersion::V1))));
        let chosen = choose_services(&info(&[DRA_PLUGIN_V1BETA1, DRA_RESOURCE_HEALTH_V1ALPHA1]));
        assert_eq!(
            chosen,
            Ok((DraApiVersion::V1beta1, Some(HealthApiVersion::V1alpha1)))
        );
    }

    #[test]
    fn registrations_the_kubelet_refuses_are_refused() {
        let no_dra = choose_services(&info(&["v2.DRAPlugin", DRA_RESOURCE_HEALTH_V1]));
        assert!(no_dra.unwrap_err().contains("DRA service"));
        let mut relative = info(&[DRA_PLUGIN_V1]);
        relative.endpoint = "dra.sock".into();
        assert!(choose_services(&relative).unwrap_err().contains("absolute"));
        let mut csi = info(&[DRA_PLUGIN_V1]);
        csi.r#type = "CSIPlugin".into();
        assert!(choose_services(&csi).unwrap_err().contains("CSIPlugin"));
    }
}
