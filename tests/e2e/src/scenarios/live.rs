//! What the cluster shows of claims in use: `status.devices` (KEP-4817) written by the plugin
//! after prepare, with the GPU's UUID, checked while the single-gpu example runs.

use anyhow::Context;
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use serde_json::Value;
use tessera_api::names::DRIVER_NAME;

use super::examples::ExampleRun;
use crate::context::Ctx;
use crate::wait::{Probe, until};

/// Every device of every claim of `run` gets a `status.devices` entry of this driver whose
/// `data.uuid` is the published device's UUID.
pub fn device_status_holds_uuid<'a>(
    ctx: &'a Ctx,
    run: &'a ExampleRun,
) -> BoxFuture<'a, anyhow::Result<()>> {
    Box::pin(async move {
        for claim in run.claims() {
            let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), claim.namespace());
            for device in claim.devices(&run.published)? {
                let uuid = device
                    .uuid()
                    .with_context(|| format!("{} publishes no uuid", device.name))?
                    .to_owned();
                let what = format!(
                    "status.devices of claim {}/{} to hold {} with data.uuid {uuid}",
                    claim.namespace(),
                    claim.name(),
                    device.name
                );
                until(&what, ctx.timeouts.event, || {
                    let api = api.clone();
                    let (uuid, device) = (uuid.clone(), device.name.clone());
                    let name = claim.name().to_owned();
                    async move {
                        let current = api.get(&name).await?;
                        let entries = current.status.and_then(|s| s.devices).unwrap_or_default();
                        let found = entries.iter().find(|e| {
                            e.driver == DRIVER_NAME
                                && e.device == device
                                && e.data.as_ref().and_then(|d| d.0.get("uuid"))
                                    == Some(&Value::String(uuid.clone()))
                        });
                        Ok(match found {
                            Some(_) => Probe::Done(()),
                            None => Probe::Waiting(serde_json::to_string(&entries)?),
                        })
                    }
                })
                .await?;
                ctx.say(format!(
                    "claim {}: status.devices has {} with UUID {uuid}",
                    claim.name(),
                    device.name
                ));
            }
        }
        Ok(())
    })
}
