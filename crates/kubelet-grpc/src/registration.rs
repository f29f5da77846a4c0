//! The plugin-watcher registration service (`pluginregistration.Registration`).
//!
//! The kubelet finds the registration socket in its registry directory, asks `GetInfo`, picks
//! the newest DRA (and health) service it supports from `supported_versions`, and reports its
//! verdict with `NotifyRegistrationStatus`, which this service records as a
//! [`RegistrationState`].

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::proto::registration as pb;

/// Plugin type a DRA driver registers as.
pub const PLUGIN_TYPE_DRA: &str = "DRAPlugin";
/// The DRA service, version v1 (kubelet 1.34+). Listed first: the preferred version.
pub const DRA_PLUGIN_V1: &str = "v1.DRAPlugin";
/// The DRA service, version v1beta1 (kubelet 1.32–1.33, and later ones for compatibility).
pub const DRA_PLUGIN_V1BETA1: &str = "v1beta1.DRAPlugin";
/// The device health stream, version v1 (kubelet 1.37+ prefers it).
pub const DRA_RESOURCE_HEALTH_V1: &str = "v1.DRAResourceHealth";
/// The device health stream, version v1alpha1 (the only one kubelets 1.34–1.36 look for).
pub const DRA_RESOURCE_HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";

/// What the kubelet last said about this plugin's registration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RegistrationState {
    /// The kubelet has not reported a verdict yet (since the plugin started).
    #[default]
    Pending,
    /// The kubelet accepted the plugin and will call it.
    Registered,
    /// The kubelet rejected the plugin, with the kubelet's reason.
    Rejected {
        /// The kubelet's error message.
        error: String,
    },
}

impl RegistrationState {
    /// True once the kubelet accepted the plugin: the readiness signal.
    pub fn is_registered(&self) -> bool {
        matches!(self, Self::Registered)
    }
}

/// Serves `GetInfo` from a fixed [`pb::PluginInfo`] and records `NotifyRegistrationStatus`.
pub(crate) struct RegistrationService {
    info: pb::PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    pub(crate) fn new(info: pb::PluginInfo, state: watch::Sender<RegistrationState>) -> Self {
        Self { info, state }
    }
}

#[tonic::async_trait]
impl pb::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::PluginInfo>, Status> {
        tracing::debug!(
            driver = %self.info.name,
            endpoint = %self.info.endpoint,
            "kubelet asked for plugin info"
        );
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pb::RegistrationStatus>,
    ) -> Result<Response<pb::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the plugin");
            RegistrationState::Registered
        } else {
            let error = if status.error.is_empty() {
                "the kubelet gave no reason".to_owned()
            } else {
                status.error
            };
            tracing::error!(driver = %self.info.name, %error, "kubelet rejected the plugin");
            RegistrationState::Rejected { error }
        };
        self.state.send_replace(state);
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{health_v1, health_v1alpha1};

    #[test]
    fn advertised_health_names_are_the_grpc_service_names() {
        // The kubelet matches the health entry of `supported_versions` against the full gRPC
        // service name (the proto packages are plain `v1` / `v1alpha1`).
        assert_eq!(
            DRA_RESOURCE_HEALTH_V1,
            health_v1::dra_resource_health_server::SERVICE_NAME
        );
        assert_eq!(
            DRA_RESOURCE_HEALTH_V1ALPHA1,
            health_v1alpha1::dra_resource_health_server::SERVICE_NAME
        );
    }
}
