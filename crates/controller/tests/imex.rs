//! IMEX domains on topology-managed GB200 trays through the API-server fake: the controller
//! publishes each clique's channels, places a gang sharing one domain claim in one clique with
//! one channel (the claim written once), and makes a domain wait, naming the holders, while
//! claims allocated elsewhere (kube-scheduler's) hold every channel of the clique.

use tessera_controller_harness as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use support::harness::*;
use support::*;
use tessera_api::imex::{IMEX_DEVICE_CLASS, pool_name};
use tessera_api::names::{GROUP_LABEL, GROUP_MIN_COUNT_ANNOTATION, TOPOLOGY_AWARE_GATE};
use tessera_controller::ControllerConfig;
use tessera_fake_apiserver::{FakeApiServer, Verb};
use tessera_gpu_inventory::render::ServerVersion;
use tessera_gpu_inventory::{DeviceSource, MockSource, RenderOptions, render_slices};

const UUID: &str = "522c88f3-2731-5718-acd9-980cbf3d0f20";

fn clique(id: u32) -> String {
    format!("{UUID}.{id}")
}

/// Managed gb200 trays `tray-<clique>-<i>` with their nodes, `trays` per clique, and the shipped
/// classes.
fn gb200(cliques: &[(u32, usize)]) -> FakeApiServer {
    let api = FakeApiServer::new();
    for class in shipped_classes() {
        api.seed(&class);
    }
    let mut tray = MockSource::new("gb200-tray").unwrap().inventory().unwrap();
    for &(id, trays) in cliques {
        for gpu in &mut tray.gpus {
            gpu.fabric.as_mut().unwrap().clique_id = id;
        }
        for i in 0..trays {
            let name = format!("tray-{id}-{i}");
            api.seed(&node(&name, true));
            let mut options = RenderOptions::new(&name);
            options.server_version = ServerVersion::V1_35;
            options.topology_managed = true;
            for slice in render_slices(&tray, &options).unwrap() {
                api.seed(&slice);
            }
        }
    }
    api
}

/// Gang `name`: `pods` pods of 4 GPUs each sharing the domain claim `<name>-domain`.
fn seed_domain_gang(api: &FakeApiServer, name: &str, pods: usize) {
    api.seed(&claim_of(&format!("{name}-domain"), IMEX_DEVICE_CLASS, 1));
    for i in 0..pods {
        let gpus = format!("{name}-{i}-gpus");
        let domain = format!("{name}-domain");
        api.seed(&gpu_claim(&gpus, 4));
        let mut pod = gated_pod(
            &format!("{name}-{i}"),
            &[
                ("gpus", Source::Claim(&gpus)),
                ("domain", Source::Claim(&domain)),
            ],
        );
        pod.metadata.labels = Some(BTreeMap::from([(GROUP_LABEL.into(), name.into())]));
        pod.metadata.annotations = Some(BTreeMap::from([(
            GROUP_MIN_COUNT_ANNOTATION.into(),
            pods.to_string(),
        )]));
        api.seed(&pod);
    }
}

/// `(pool, device)` of each result of an allocated claim.
fn results(api: &FakeApiServer, name: &str) -> Vec<(String, String)> {
    claim(api, name)
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.pool, r.device))
        .collect()
}

fn config(channels: u32) -> ControllerConfig {
    let mut config = ControllerConfig::new(TOPOLOGY_AWARE_GATE);
    config.imex_channels = channels;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_gang_runs_in_one_clique_on_one_channel_written_once() {
    // Clique 7 has 4 trays, clique 9 has 3: the 4-tray gang fits only in clique 7.
    let api = gb200(&[(7, 4), (9, 3)]);
    seed_domain_gang(&api, "train", 4);
    let controller = start_with(&api, config(2));
    for i in 0..4 {
        released(&api, &format!("train-{i}")).await;
    }
    assert_eq!(
        results(&api, "train-domain"),
        [(pool_name(&clique(7)), "channel-0".to_owned())]
    );
    let mut nodes: Vec<String> = (0..4)
        .map(|i| {
            placement(&claim(&api, &format!("train-{i}-gpus")))
                .unwrap()
                .0
        })
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["tray-7-0", "tray-7-1", "tray-7-2", "tray-7-3"]);
    let domain_writes = api
        .requests()
        .iter()
        .filter(|r| {
            r.verb == Verb::Patch
                && r.resource.starts_with("resourceclaims")
                && r.subresource == "status"
                && r.name == "train-domain"
        })
        .count();
    assert_eq!(domain_writes, 1, "the domain claim is allocated once");
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_waits_while_the_scheduler_holds_every_channel_of_the_clique_then_runs() {
    let api = gb200(&[(9, 3)]);
    // Two domains kube-scheduler allocated (no controller mark) hold both channels of clique 9.
    for (name, channel) in [("old-a", "channel-0"), ("old-b", "channel-1")] {
        let mut held = allocated(
            claim_of(name, IMEX_DEVICE_CLASS, 1),
            &pool_name(&clique(9)),
            &[channel],
        );
        if let Some(a) = held.status.as_mut().and_then(|s| s.allocation.as_mut()) {
            a.node_selector = None;
        }
        api.seed(&held);
    }
    seed_domain_gang(&api, "late", 2);
    let controller = start_with(&api, config(2));
    // Until the channels are published the domain waits for them; then for a free one.
    let expected = format!(
        "no free IMEX channel in clique {} (2 of 2 in use)",
        clique(9)
    );
    let pod = api
        .wait_for::<Pod>(Some(NS), "late-0", PATIENCE, |p| {
            placement_condition(p).is_some_and(|(_, reason, message)| {
                reason == "GroupUnsatisfiable" && message.contains(&expected)
            })
        })
        .await
        .unwrap_or_else(|last| panic!("late-0 never waited for a channel: {last:#?}"));
    let (_, _, message) = placement_condition(&pod).unwrap();
    assert!(
        message.contains("held by the domains ml/old-a, ml/old-b"),
        "{message}"
    );
    assert!(placement(&claim(&api, "late-domain")).is_none());

    // One of them is released: the domain gets its channel.
    api.remove::<ResourceClaim>(Some(NS), "old-b");
    released(&api, "late-0").await;
    released(&api, "late-1").await;
    assert_eq!(
        results(&api, "late-domain"),
        [(pool_name(&clique(9)), "channel-1".to_owned())]
    );
    assert!(double_allocations(&api).is_empty());
    controller.stop().await;
}
