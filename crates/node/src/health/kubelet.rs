//! Gives any [`DraDriver`] the node's device health stream: [`WithDeviceHealth`] delegates
//! prepare and unprepare and answers `device_health` with the publisher's channel, so the
//! claim-preparation driver does not need to know about health monitoring.

use std::collections::BTreeMap;

use tessera_kubelet_grpc::{
    ClaimRef, ClaimUid, DeviceHealth, DraDriver, PrepareResult, UnprepareResult,
};
use tokio::sync::watch;

/// A driver plus the device health channel the kubelet plugin streams.
#[derive(Debug)]
pub struct WithDeviceHealth<D> {
    driver: D,
    health: watch::Receiver<Vec<DeviceHealth>>,
}

impl<D> WithDeviceHealth<D> {
    /// Wraps `driver`; `health` holds the full device list (the publisher keeps it current).
    pub fn new(driver: D, health: watch::Receiver<Vec<DeviceHealth>>) -> Self {
        Self { driver, health }
    }

    /// The wrapped driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }
}

impl<D: DraDriver> DraDriver for WithDeviceHealth<D> {
    type Error = D::Error;

    async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<ClaimUid, PrepareResult<D::Error>> {
        self.driver.prepare(claims).await
    }

    async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<ClaimUid, UnprepareResult<D::Error>> {
        self.driver.unprepare(claims).await
    }

    fn device_health(&self) -> Option<watch::Receiver<Vec<DeviceHealth>>> {
        Some(self.health.clone())
    }
}
