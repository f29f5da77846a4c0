//! What the node plugin's `/readyz` checks: claim preparation has recovered its state, the
//! kubelet has registered the plugin and the node's ResourceSlices have been published at least
//! once.

use tessera_kubelet_grpc::RegistrationState;
use tessera_process::Probe;
use tokio::sync::watch;

/// The plugin's readiness.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The kubelet's registration verdict ([`tessera_kubelet_grpc::KubeletPlugin::registration_state`]).
    pub registration: watch::Receiver<RegistrationState>,
    /// Whether the node's slices have been published at least once.
    pub published: watch::Receiver<bool>,
    /// Why claim preparation has not recovered its state yet (`None`: it has;
    /// [`tessera_prepare::NodeDriver::recovery`]).
    pub recovery: watch::Receiver<Option<String>>,
}

impl Probe for Readiness {
    /// `Ok` when ready, else what is missing.
    fn check(&self) -> Result<(), Vec<String>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_recovered_registered_and_published() {
        let (registration, registration_rx) = watch::channel(RegistrationState::Pending);
        let (published, published_rx) = watch::channel(false);
        let (recovery, recovery_rx) = watch::channel(Some("LIST failed".to_owned()));
        let readiness = Readiness {
            registration: registration_rx,
            published: published_rx,
            recovery: recovery_rx,
        };
        let missing = readiness.check().unwrap_err();
        assert_eq!(
            missing,
            [
                "claim preparation is still recovering its state (retrying): LIST failed",
                "the kubelet has not registered the plugin yet",
                "the node's ResourceSlices have not been published yet"
            ]
        );
        registration.send_replace(RegistrationState::Rejected {
            error: "unsupported version".into(),
        });
        published.send_replace(true);
        recovery.send_replace(None);
        assert_eq!(
            readiness.check().unwrap_err(),
            ["the kubelet rejected the plugin: unsupported version"]
        );
        registration.send_replace(RegistrationState::Registered);
        assert_eq!(readiness.check(), Ok(()));
    }
}
