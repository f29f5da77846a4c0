//! What the suite prints when a scenario fails: the published slices, then per namespace the
//! claims, pods and events, then the tails of the Tessera (and scheduler) logs. Compact: one line
//! per object, so the failure reads top to bottom.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use tessera_api::names::DRIVER_NAME;

use crate::claims::{AllocationStatus, reserved_for};
use crate::context::Ctx;
use crate::steps::pod_summary;

const EVENTS_PER_NAMESPACE: usize = 40;
const LOG_LINES: usize = 40;

pub async fn dump(ctx: &Ctx, namespaces: &[String]) {
    println!("  ---- diagnostics ----");
    dump_slices(ctx).await;
    for namespace in namespaces {
        dump_namespace(ctx, namespace).await;
    }
    for (name, text) in ctx.observer.log_tails(LOG_LINES, namespaces).await {
        println!("  -- {name}:");
        for line in text.lines() {
            println!("     {line}");
        }
    }
    println!("  ---- end of diagnostics ----");
}

async fn dump_slices(ctx: &Ctx) {
    let slices = match Api::<ResourceSlice>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(error) => {
            println!("  ResourceSlices: cannot list: {error}");
            return;
        }
    };
    println!("  ResourceSlices ({} in total):", slices.len());
    let mut by_node: BTreeMap<String, Vec<&ResourceSlice>> = BTreeMap::new();
    for slice in &slices {
        by_node
            .entry(
                slice
                    .spec
                    .node_name
                    .clone()
                    .unwrap_or_else(|| "<no node>".to_owned()),
            )
            .or_default()
            .push(slice);
    }
    for (node, slices) in by_node {
        for slice in slices {
            let devices = slice.spec.devices.as_deref().unwrap_or_default();
            let tainted = devices
                .iter()
                .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
                .count();
            println!(
                "    {node}: {} driver {} pool {} gen {} — {} devices, {tainted} tainted{}",
                slice.metadata.name.as_deref().unwrap_or_default(),
                slice.spec.driver,
                slice.spec.pool.name,
                slice.spec.pool.generation,
                devices.len(),
                if slice.spec.driver == DRIVER_NAME {
                    ""
                } else {
                    " (not Tessera's)"
                }
            );
        }
    }
}

async fn dump_namespace(ctx: &Ctx, namespace: &str) {
    println!("  namespace {namespace}:");
    match Api::<ResourceClaim>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            for claim in list.items {
                let name = claim.metadata.name.clone().unwrap_or_default();
                let allocation = match AllocationStatus::of(&claim) {
                    Some(a) => format!(
                        "allocated on {}: {}",
                        a.node.as_deref().unwrap_or("<no node>"),
                        a.device_names().join(", ")
                    ),
                    None => "not allocated".to_owned(),
                };
                println!(
                    "    claim {name}: {allocation}; reserved for [{}]",
                    reserved_for(&claim).join(", ")
                );
            }
        }
        Err(error) => println!("    claims: cannot list: {error}"),
    }
    match Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            for pod in list.items {
                println!(
                    "    pod {}: {}",
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    pod_summary(&pod)
                );
            }
        }
        Err(error) => println!("    pods: cannot list: {error}"),
    }
    match Api::<Event>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => {
            let mut events = list.items;
            events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
            let skip = events.len().saturating_sub(EVENTS_PER_NAMESPACE);
            if skip > 0 {
                println!("    ({skip} older events not shown)");
            }
            for event in events.into_iter().skip(skip) {
                println!("    event {}", event_line(&event));
            }
        }
        Err(error) => println!("    events: cannot list: {error}"),
    }
}

/// `Warning FailedPrepareDynamicResources pod/x (×3): message`.
pub fn event_line(event: &Event) -> String {
    let object = &event.involved_object;
    let count = match event.count {
        Some(n) if n > 1 => format!(" (×{n})"),
        _ => String::new(),
    };
    format!(
        "{} {} {}/{}{count}: {}",
        event.type_.as_deref().unwrap_or(""),
        event.reason.as_deref().unwrap_or(""),
        object.kind.as_deref().unwrap_or("").to_lowercase(),
        object.name.as_deref().unwrap_or(""),
        event.message.as_deref().unwrap_or("").trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_on_one_line() {
        let event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "pod"},
            "type": "Warning",
            "reason": "FailedPrepareDynamicResources",
            "count": 3,
            "message": "bad config\n"
        }))
        .unwrap();
        assert_eq!(
            event_line(&event),
            "Warning FailedPrepareDynamicResources pod/pod (×3): bad config"
        );
    }
}
