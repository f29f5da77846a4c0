//! The shipped topologies, the topology file's error reporting, and NVLink islands.

use std::collections::BTreeSet;

use pretty_assertions::assert_eq;
use tessera_gpu_inventory::{
    DeviceSource, FabricState, GpuInventory, MockSource, NvLinkRemoteType, NvLinkState,
    NvLinkVersion, SHIPPED_TOPOLOGIES, SourceError, island_of, parse_topology,
};

fn shipped(name: &str) -> GpuInventory {
    MockSource::new(name)
        .expect("shipped topology exists")
        .inventory()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_shipped_topology_loads_and_round_trips_through_yaml() {
    assert_eq!(SHIPPED_TOPOLOGIES.len(), 5);
    for (name, _) in SHIPPED_TOPOLOGIES {
        let inventory = shipped(name);
        assert!(!inventory.gpus.is_empty(), "{name}");
        let yaml = serde_yaml::to_string(&inventory).unwrap();
        let again = parse_topology("round-trip", &yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(again, inventory, "{name}");
    }
}

#[test]
fn dgx_h100_is_one_nvswitch_island_on_two_numa_nodes() {
    let inv = shipped("dgx-h100");
    assert_eq!(inv.gpus.len(), 8);
    let numa: BTreeSet<_> = inv.gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(numa, BTreeSet::from([Some(0), Some(1)]));
    for (socket, want) in [(0, 4), (1, 4)] {
        let on = inv
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(socket))
            .count();
        assert_eq!(on, want);
    }
    let roots: BTreeSet<_> = inv.gpus.iter().map(|g| g.pcie_root.clone()).collect();
    assert_eq!(roots.len(), 8, "every GPU has its own PCIe root");
    let islands = inv.nvlink_islands();
    assert_eq!(islands.len(), 1);
    assert_eq!(islands[0].members.len(), 8);
    for gpu in &inv.gpus {
        assert_eq!(gpu.active_nvlinks().count(), 18);
        assert_eq!(gpu.nvlink_bandwidth_gbps(), 900);
        assert!(gpu.mig_capable() && !gpu.mig_enabled());
        assert_eq!(gpu.memory_bytes, 81559 << 20);
        assert_eq!(gpu.fabric_clique(), None);
    }
}

#[test]
fn hgx_a100_mig_has_mixed_mig_layouts() {
    let inv = shipped("hgx-a100-mig");
    let layout: Vec<(u32, Vec<(String, u32)>)> = inv
        .gpus
        .iter()
        .filter(|g| g.mig_enabled())
        .map(|g| {
            let mig = g.mig.as_ref().unwrap();
            let instances = mig
                .instances
                .iter()
                .map(|i| (i.profile.clone(), i.placement_start))
                .collect();
            (g.index, instances)
        })
        .collect();
    let s = |p: &str, start| (p.to_owned(), start);
    assert_eq!(
        layout,
        vec![
            (0, (0..7).map(|start| s("1g.10gb", start)).collect()),
            (
                1,
                vec![
                    s("2g.20gb", 0),
                    s("1g.10gb", 2),
                    s("1g.10gb", 3),
                    s("3g.40gb", 4)
                ]
            ),
            (2, vec![s("4g.40gb", 0), s("3g.40gb", 4)]),
            (
                3,
                vec![
                    s("1g.20gb", 0),
                    s("1g.10gb+me", 2),
                    s("2g.20gb", 4),
                    s("1g.20gb", 6)
                ]
            ),
        ]
    );
    let a100 = inv.gpus[4].mig.as_ref().unwrap();
    assert_eq!(a100.memory_slice_count(), 8);
    assert_eq!(a100.compute_slice_count(), 7);
    assert_eq!(a100.largest_profile().unwrap().name, "7g.80gb");
    let me = a100.profile("1g.10gb+me").unwrap();
    assert_eq!(
        (me.profile_id, me.profile_index, me.instance_count),
        (20, 7, 1)
    );
    assert_eq!(
        (me.engines.jpeg_engines, me.engines.ofa_engines),
        (1, 1),
        "media extensions"
    );
    let minors: Vec<u32> = inv.gpus.iter().map(|g| g.minor).collect();
    assert_eq!(minors, [2, 3, 0, 1, 6, 7, 4, 5]);
}

#[test]
fn pcie_l40s_has_no_nvlink_and_no_mig() {
    let inv = shipped("pcie-l40s");
    assert_eq!(inv.gpus.len(), 4);
    assert!(inv.nvlink_islands().is_empty());
    assert!(
        inv.gpus
            .iter()
            .all(|g| !g.mig_capable() && g.nvlinks.is_empty())
    );
    assert_eq!(inv.driver_version, "535.129.03");
}

#[test]
fn pcie_a100_pairs_form_two_islands() {
    let inv = shipped("pcie-a100-nvlink-pairs");
    let islands = inv.nvlink_islands();
    assert_eq!(islands.len(), 2);
    for (a, b) in [(0, 1), (2, 3)] {
        let island = island_of(&islands, &inv.gpus[a].uuid).unwrap();
        assert_eq!(island_of(&islands, &inv.gpus[b].uuid), Some(island));
        assert_eq!(island.members.len(), 2);
    }
    assert!(inv.gpus.iter().all(|g| g.nvlink_bandwidth_gbps() == 600));
    assert!(inv.gpus[0].nvlinks.iter().all(|l| {
        l.remote_type == NvLinkRemoteType::Gpu
            && l.version == NvLinkVersion::V3_0
            && l.state == NvLinkState::Active
    }));
}

#[test]
fn gb200_tray_joins_a_fabric_clique() {
    let inv = shipped("gb200-tray");
    assert_eq!(inv.gpus.len(), 4);
    assert_eq!(inv.nvlink_islands().len(), 1);
    let cliques: BTreeSet<_> = inv.gpus.iter().map(|g| g.fabric_clique()).collect();
    assert_eq!(cliques.len(), 1);
    let clique = cliques.into_iter().next().flatten().unwrap();
    assert!(clique.ends_with(".32766") && clique.len() <= 64, "{clique}");
    assert!(inv.gpus.iter().all(|g| g.nvlink_bandwidth_gbps() == 1800));
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.fabric.as_ref().unwrap().state == FabricState::Completed)
    );
}

#[test]
fn island_ids_do_not_depend_on_enumeration_order() {
    for (name, _) in SHIPPED_TOPOLOGIES {
        let inv = shipped(name);
        let mut reversed = inv.clone();
        reversed.gpus.reverse();
        for (i, gpu) in reversed.gpus.iter_mut().enumerate() {
            gpu.index = i as u32;
        }
        assert_eq!(inv.nvlink_islands(), reversed.nvlink_islands(), "{name}");
        for island in inv.nvlink_islands() {
            assert!(island.id.starts_with("nvl-") && island.id.len() == 20);
        }
    }
}

/// A ring of four bridged cards: 0-1, 1-2, 2-3, 3-0. No three are pairwise connected, so the
/// islands are two of the ring's edges, chosen by smallest sorted UUIDs.
#[test]
fn non_transitive_links_split_into_deterministic_cliques() {
    let mut inv = shipped("pcie-a100-nvlink-pairs");
    let bus: Vec<String> = inv.gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let ring = [(0, 1), (1, 2), (2, 3), (3, 0)];
    for gpu in &mut inv.gpus {
        gpu.nvlinks.clear();
    }
    for (n, (a, b)) in ring.into_iter().enumerate() {
        for (from, to) in [(a, b), (b, a)] {
            let mut link = shipped("pcie-a100-nvlink-pairs").gpus[0].nvlinks[0].clone();
            link.link = n as u32;
            link.remote_pci_bus_id = bus[to].clone();
            inv.gpus[from].nvlinks.push(link);
        }
    }
    inv.validate().unwrap();
    let islands = inv.nvlink_islands();
    assert_eq!(islands.len(), 2);
    assert!(islands.iter().all(|i| i.members.len() == 2));
    let mut sorted: Vec<&str> = inv.gpus.iter().map(|g| g.uuid.as_str()).collect();
    sorted.sort();
    // The smallest UUID goes with the smaller of its two ring neighbours.
    let first = &islands[0].members;
    assert_eq!(first[0], sorted[0]);
    let smallest = inv.gpus.iter().position(|g| g.uuid == sorted[0]).unwrap();
    let neighbours: Vec<&str> = ring
        .iter()
        .filter_map(|&(a, b)| {
            (a == smallest)
                .then_some(b)
                .or((b == smallest).then_some(a))
        })
        .map(|i| inv.gpus[i].uuid.as_str())
        .collect();
    assert_eq!(first[1], *neighbours.iter().min().unwrap());
}

fn syntax_error(yaml: &str) -> (Option<usize>, String, String) {
    match parse_topology("bad.yaml", yaml) {
        Err(SourceError::TopologySyntax {
            file,
            line,
            field,
            message,
            ..
        }) => {
            assert_eq!(file, "bad.yaml");
            (line, field, message)
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

const MINIMAL: &str = r#"driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    index: 0
    minor: 0
    productName: NVIDIA L40S
    brand: Nvidia
    architecture: Ada
    cudaComputeCapability: "8.9"
    memory: 46068Mi
    multiprocessors: 142
    pciBusId: "0000:4a:00.0"
"#;

#[test]
fn minimal_file_parses() {
    let inv = parse_topology("minimal.yaml", MINIMAL).unwrap();
    assert_eq!(inv.gpus[0].memory_bytes, 46068 << 20);
    assert_eq!(inv.gpus[0].numa_node, None);
}

#[test]
fn malformed_files_name_file_line_and_field() {
    let (line, field, message) = syntax_error(&MINIMAL.replace("142", "lots"));
    assert_eq!(line, Some(12));
    assert_eq!(field, "gpus[0].multiprocessors");
    assert!(message.contains("expected u32"), "{message}");

    let (line, field, message) = syntax_error(&MINIMAL.replace("46068Mi", "45GB"));
    assert_eq!((line, field.as_str()), (Some(11), "gpus[0].memory"));
    assert!(message.contains("binary quantity"), "{message}");

    let (_, field, message) = syntax_error(&MINIMAL.replace("\"8.9\"", "\"8\""));
    assert_eq!(field, "gpus[0].cudaComputeCapability");
    assert!(message.contains("<major>.<minor>"), "{message}");

    let (_, field, message) = syntax_error(&MINIMAL.replace("brand: Nvidia", "brand: Nvidai"));
    assert_eq!(field, "gpus[0].brand");
    assert!(message.contains("expected one of"), "{message}");

    let (line, _, message) =
        syntax_error(&MINIMAL.replace("    minor: 0\n", "    minor: 0\n    minro: 1\n"));
    assert_eq!(line, Some(7));
    assert!(message.contains("unknown field `minro`"), "{message}");

    let (_, field, message) = syntax_error(&MINIMAL.replace("    minor: 0\n", ""));
    assert_eq!(field, "gpus[0]");
    assert!(message.contains("missing field `minor`"), "{message}");

    let err = parse_topology("bad.yaml", &MINIMAL.replace("142", "lots")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad.yaml:12:22: field `gpus[0].multiprocessors`: invalid type: string \"lots\", expected u32"
    );
}

#[test]
fn inconsistent_files_list_every_problem() {
    // GPU 1's 1g.10gb@3 (the second `placementStart: 3` of the file) moved onto its 2g.20gb at
    // slices 0..1, and GPU 1 given GPU 0's PCI bus id.
    let yaml = replace_nth(
        &shipped_yaml("hgx-a100-mig"),
        "placementStart: 3",
        "placementStart: 1",
        1,
    )
    .replacen(
        "pciBusId: \"0000:0f:00.0\"",
        "pciBusId: \"0000:07:00.0\"",
        1,
    );
    match parse_topology("hgx.yaml", &yaml) {
        Err(SourceError::TopologyInvalid { file, problems }) => {
            assert_eq!(file, "hgx.yaml");
            let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
            assert!(fields.contains(&"gpus[1].pciBusId"), "{fields:?}");
            assert!(
                fields.contains(&"gpus[1].mig.instances[2].placementStart"),
                "{fields:?}"
            );
            let text = SourceError::TopologyInvalid {
                file,
                problems: problems.clone(),
            }
            .to_string();
            assert!(text.contains("is already used by gpus[0]"), "{text}");
            assert!(
                text.contains("memory slice 1 is also used by instances[0]"),
                "{text}"
            );
        }
        other => panic!("expected validation problems, got {other:?}"),
    }
}

#[test]
fn links_must_name_a_gpu_of_the_node() {
    let yaml = shipped_yaml("pcie-a100-nvlink-pairs").replace("0000:31:00.0\"}", "0000:99:00.0\"}");
    let err = parse_topology("pairs.yaml", &yaml).unwrap_err().to_string();
    assert!(err.contains("gpus[0].nvlinks[0].remotePciBusId"), "{err}");
    assert!(
        err.contains("no GPU of this node has PCI bus id `0000:99:00.0`"),
        "{err}"
    );
}

#[test]
fn a_link_to_a_lost_peer_is_accepted_while_a_gpu_is_lost() {
    let mut inventory = shipped("pcie-a100-nvlink-pairs");
    let first = &inventory.gpus[0];
    let peer = match inventory.link_peer(&first.nvlinks[0]) {
        tessera_gpu_inventory::LinkPeer::Gpu(peer) => peer.uuid.clone(),
        other => panic!("the first GPU's link 0 goes to a GPU, not {other:?}"),
    };
    inventory.gpus.retain(|g| g.uuid != peer);
    assert!(
        inventory.validate().is_err(),
        "without a lost GPU the dangling link is a problem"
    );
    inventory.lost_gpus = vec![peer];
    inventory.validate().unwrap();
}

#[test]
fn unknown_topology_lists_the_shipped_ones() {
    let err = MockSource::new("dgx-h200").unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown topology `dgx-h200`: not a file, and not one of the shipped topologies \
         (dgx-h100, hgx-a100-mig, pcie-l40s, pcie-a100-nvlink-pairs, gb200-tray)"
    );
}

#[test]
fn topology_files_are_read_on_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.yaml");
    std::fs::write(&path, MINIMAL).unwrap();
    let source = MockSource::new(path.to_str().unwrap()).unwrap();
    assert_eq!(source.inventory().unwrap().gpus.len(), 1);
    std::fs::write(&path, MINIMAL.replace("142", "x")).unwrap();
    let err = source.inventory().unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:12:", path.display())), "{err}");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        source.inventory(),
        Err(SourceError::ReadTopology { .. })
    ));
}

fn shipped_yaml(name: &str) -> String {
    tessera_gpu_inventory::mock::shipped_topology(name)
        .unwrap()
        .to_owned()
}

fn replace_nth(text: &str, from: &str, to: &str, n: usize) -> String {
    let (at, _) = text.match_indices(from).nth(n).expect("occurrence exists");
    format!("{}{to}{}", &text[..at], &text[at + from.len()..])
}

#[test]
fn published_device_names_resolve_to_their_hardware() {
    use tessera_gpu_inventory::ResolvedDevice;
    let inv = shipped("hgx-a100-mig");
    // Index 3 is minor 1: its 1g.10gb+me instance sits at memory slice 2.
    match inv.resolve_device("gpu-1-mig-1g-10gb-me-2") {
        Some(ResolvedDevice::Mig {
            gpu,
            profile,
            placement_start,
            instance: Some(instance),
        }) => {
            assert_eq!(gpu.index, 3);
            assert_eq!(
                (profile.name.as_str(), profile.profile_id),
                ("1g.10gb+me", 20)
            );
            assert_eq!(placement_start, 2);
            assert_eq!(
                (instance.gpu_instance_id, instance.compute_instance_id),
                (9, 0)
            );
        }
        other => panic!("{other:?}"),
    }
    // A placement with no instance yet (dynamic MIG creates it at prepare time).
    match inv.resolve_device("gpu-1-mig-1g-10gb-3") {
        Some(ResolvedDevice::Mig {
            instance: None,
            placement_start: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match inv.resolve_device("gpu-6") {
        Some(ResolvedDevice::Gpu(gpu)) => assert_eq!(gpu.index, 4),
        other => panic!("{other:?}"),
    }
    for unknown in [
        "gpu-8",
        "gpu-1-mig-1g-10gb-7",
        "gpu-1-mig-5g-50gb-0",
        "gpu-6-mig-1g-10gb-0x",
        "nic-0",
    ] {
        assert_eq!(inv.resolve_device(unknown), None, "{unknown}");
    }
    // Every published device resolves.
    for dynamic_mig in [false, true] {
        let options = tessera_gpu_inventory::RenderOptions {
            dynamic_mig,
            ..tessera_gpu_inventory::RenderOptions::new("n")
        };
        for slice in tessera_gpu_inventory::render_slices(&inv, &options).unwrap() {
            for device in slice.spec.devices.iter().flatten() {
                assert!(
                    inv.resolve_device(&device.name).is_some(),
                    "{}",
                    device.name
                );
            }
        }
    }
}
