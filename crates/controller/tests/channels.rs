//! The IMEX channel slices the controller publishes, planned from the GPU slices: one pool per
//! fabric clique, network-attached to its nodes, rewritten with the next generation when the
//! clique changes, deleted when it is gone.

use k8s_openapi::api::resource::v1::ResourceSlice;
use tessera_controller::channels::{ChannelSettings, Hostnames, plan};
use tessera_gpu_inventory::{
    DeviceSource, MockSource, RenderOptions, ServerVersion, render_slices,
};

fn tray(node: &str, clique: u32, managed: bool) -> Vec<ResourceSlice> {
    let mut inventory = MockSource::new("gb200-tray").unwrap().inventory().unwrap();
    for gpu in &mut inventory.gpus {
        gpu.fabric.as_mut().unwrap().clique_id = clique;
    }
    let mut options = RenderOptions::new(node);
    options.server_version = ServerVersion::V1_35;
    options.topology_managed = managed;
    render_slices(&inventory, &options).unwrap()
}

fn dgx(node: &str) -> Vec<ResourceSlice> {
    let inventory = MockSource::new("dgx-h100").unwrap().inventory().unwrap();
    let mut options = RenderOptions::new(node);
    options.server_version = ServerVersion::V1_35;
    render_slices(&inventory, &options).unwrap()
}

const SETTINGS: ChannelSettings = ChannelSettings {
    channels: 128,
    server_version: ServerVersion::V1_35,
};

fn selected_nodes(slice: &ResourceSlice) -> Vec<String> {
    slice
        .spec
        .node_selector
        .as_ref()
        .unwrap()
        .node_selector_terms[0]
        .match_expressions
        .as_ref()
        .unwrap()[0]
        .values
        .clone()
        .unwrap()
}

#[test]
fn one_pool_per_clique_written_once_and_rewritten_when_the_clique_changes() {
    let mut cluster: Vec<ResourceSlice> = [
        tray("tray-1", 7, true),
        tray("tray-2", 7, true),
        tray("tray-3", 9, false),
        dgx("dgx-1"),
    ]
    .concat();
    // tray-2's hostname label differs from its name: the selector names the label's value.
    let hostnames = Hostnames::from([("tray-2".to_owned(), "tray-2.rack-a".to_owned())]);
    let first = plan(&cluster, &hostnames, &SETTINGS);
    assert!(first.delete.is_empty() && first.refused.is_empty());
    let pools: Vec<(&str, i64, usize)> = first
        .apply
        .iter()
        .map(|s| {
            (
                s.spec.pool.name.as_str(),
                s.spec.pool.generation,
                s.spec.devices.as_ref().unwrap().len(),
            )
        })
        .collect();
    let clique = |id: u32| format!("imex-522c88f3-2731-5718-acd9-980cbf3d0f20.{id}");
    assert_eq!(
        pools,
        [
            (clique(7).as_str(), 1, 64),
            (clique(7).as_str(), 1, 64),
            (clique(9).as_str(), 1, 128),
        ],
        "managed trays' channels are tainted (64 a slice); the dgx has no fabric"
    );
    assert_eq!(selected_nodes(&first.apply[0]), ["tray-1", "tray-2.rack-a"]);
    assert_eq!(selected_nodes(&first.apply[2]), ["tray-3"]);

    // Published: nothing more to do.
    cluster.extend(first.apply.clone());
    assert_eq!(plan(&cluster, &hostnames, &SETTINGS), Default::default());

    // A third tray joins clique 7: its pool is rewritten with the next generation.
    cluster.extend(tray("tray-4", 7, true));
    let grown = plan(&cluster, &hostnames, &SETTINGS);
    assert_eq!(grown.apply.len(), 2);
    assert!(grown.apply.iter().all(|s| s.spec.pool.generation == 2));
    assert_eq!(
        selected_nodes(&grown.apply[0]),
        ["tray-1", "tray-2.rack-a", "tray-4"]
    );
    assert!(grown.delete.is_empty());

    // Clique 9's only tray goes: its channels go with it.
    cluster.retain(|s| s.spec.node_name.as_deref() != Some("tray-3"));
    let shrunk = plan(&cluster, &hostnames, &SETTINGS);
    assert_eq!(shrunk.delete, [format!("{}-gpu.tessera.dev-0", clique(9))]);

    // Publishing turned off: every channel slice goes.
    let off = plan(
        &cluster,
        &hostnames,
        &ChannelSettings {
            channels: 0,
            ..SETTINGS
        },
    );
    assert!(off.apply.is_empty());
    assert_eq!(off.delete.len(), 3);
}
