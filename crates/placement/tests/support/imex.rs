//! GB200 NVL72 trays (4 GPUs, topology-managed) in fabric cliques, with each clique's IMEX
//! channel pool as the controller publishes it, as plain objects.

use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera_api::names::RACK_LABEL;
use tessera_gpu_inventory::{
    ChannelPool, DeviceSource, HOSTNAME_LABEL, MockSource, RenderOptions, ServerVersion,
    render_channel_slices, render_slices,
};
use tessera_placement::ClusterObjects;
use tessera_placement::synthetic::{self, gpu_node};

/// The fabric's cluster UUID in the shipped gb200-tray topology.
pub const CLUSTER_UUID: &str = "522c88f3-2731-5718-acd9-980cbf3d0f20";

/// Trays `tray-<clique>-<i>` per `(clique id, trays)`, each clique one rack, with `channels`
/// channels per clique.
pub fn gb200_cluster(cliques: &[(u32, usize)], channels: u32) -> ClusterObjects {
    let mut tray = MockSource::new("gb200-tray").unwrap().inventory().unwrap();
    let mut objects = ClusterObjects {
        classes: vec![synthetic::gpu_class(), synthetic::imex_class()],
        ..ClusterObjects::default()
    };
    for &(id, trays) in cliques {
        for gpu in &mut tray.gpus {
            let fabric = gpu.fabric.as_mut().unwrap();
            assert_eq!(fabric.cluster_uuid, CLUSTER_UUID);
            fabric.clique_id = id;
        }
        let names: Vec<String> = (0..trays).map(|i| format!("tray-{id}-{i}")).collect();
        for name in &names {
            let options = RenderOptions {
                topology_managed: true,
                ..RenderOptions::new(name.clone())
            };
            objects
                .slices
                .extend(render_slices(&tray, &options).unwrap());
            objects.nodes.push(gpu_node(
                name,
                [
                    (HOSTNAME_LABEL, name.clone()),
                    (RACK_LABEL, format!("nvl-{id}")),
                ],
            ));
        }
        objects.slices.extend(channel_slices(id, names, channels));
    }
    objects
}

fn channel_slices(id: u32, nodes: Vec<String>, channels: u32) -> Vec<ResourceSlice> {
    render_channel_slices(&ChannelPool {
        driver: tessera_api::names::DRIVER_NAME.to_owned(),
        clique: format!("{CLUSTER_UUID}.{id}"),
        nodes,
        channels,
        managed: true,
        generation: 1,
        server_version: ServerVersion::V1_35,
    })
    .unwrap()
}
