//! Per-node device identities for mock topologies.
//!
//! A topology file describes a *kind* of node, so every node that runs the mock backend with the
//! same topology would publish the same GPU and MIG UUIDs. Real GPUs never share UUIDs across
//! nodes, and users and tools key on them (`NVIDIA_VISIBLE_DEVICES`, dashboards), so when the node
//! name is known each UUID is replaced by a name-based one derived from the node name and the
//! file's UUID: stable across restarts of the same node, different between nodes.
//!
//! The derived UUID is an RFC 9562 version-8 name-based UUID: the first 16 bytes of the SHA-256
//! of a fixed namespace string, the node name and the file's UUID (each length-prefixed), with
//! the version and variant bits set. The `GPU-` / `MIG-` prefix is kept. Nothing else of the inventory changes:
//! NVLink peers are named by PCI bus id, and the fabric cluster UUID is shared by the nodes of one
//! NVLink domain on purpose.

use sha2::{Digest, Sha256};

use crate::model::GpuInventory;

/// Domain separation for the hash, so these UUIDs cannot collide with other name-based ones.
const NAMESPACE: &[u8] = b"tessera mock device identity";

/// The inventory with every GPU and MIG-device UUID replaced by the one this node would have.
pub fn for_node(mut inventory: GpuInventory, node_name: &str) -> GpuInventory {
    for gpu in &mut inventory.gpus {
        gpu.uuid = node_uuid(node_name, &gpu.uuid);
        if let Some(mig) = &mut gpu.mig {
            for instance in &mut mig.instances {
                instance.uuid = node_uuid(node_name, &instance.uuid);
            }
        }
    }
    inventory
}

/// The UUID on node `node_name` of the device that has `uuid` in the topology file. The prefix up
/// to the first `-` (`GPU`, `MIG`) is kept; the rest becomes a hyphenated 8-4-4-4-12 UUID.
pub fn node_uuid(node_name: &str, uuid: &str) -> String {
    let prefix = uuid.split_once('-').map_or("", |(prefix, _)| prefix);
    name_based_uuid(prefix, &[node_name, uuid])
}

/// `<prefix>-<uuid>` (or the bare UUID when `prefix` is empty), the UUID being the version-8
/// name-based UUID of `names`: deterministic, and different for any other list of names.
pub fn name_based_uuid(prefix: &str, names: &[&str]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(NAMESPACE);
    for name in names {
        // Length-prefixed, so no two lists of names hash the same input.
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    // Version 8 ("custom", here name-based with SHA-256) and the RFC 9562 variant.
    let body = uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string();
    if prefix.is_empty() {
        body
    } else {
        format!("{prefix}-{body}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_prefix_and_the_uuid_shape() {
        let derived = node_uuid("node-a", "GPU-c9bb4c18-b064-5292-b9c3-057c912026de");
        let body = derived.strip_prefix("GPU-").expect("GPU- prefix kept");
        let groups: Vec<usize> = body.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert!(
            body.chars()
                .all(|c| c == '-' || matches!(c, '0'..='9' | 'a'..='f'))
        );
        assert_eq!(&body[14..15], "8", "version nibble");
        assert!(
            matches!(&body[19..20], "8" | "9" | "a" | "b"),
            "variant bits"
        );
        let mig = node_uuid("node-a", "MIG-dc6567e2-0e1b-5d31-83ef-e10bb3b3274d");
        assert!(mig.starts_with("MIG-"));
    }

    #[test]
    fn depends_on_node_and_device_only() {
        let uuid = "GPU-c9bb4c18-b064-5292-b9c3-057c912026de";
        assert_eq!(node_uuid("node-a", uuid), node_uuid("node-a", uuid));
        assert_ne!(node_uuid("node-a", uuid), node_uuid("node-b", uuid));
        assert_ne!(
            node_uuid("node-a", uuid),
            node_uuid("node-a", "GPU-84cd579b-bbe1-571a-ac32-69cf1ade4858")
        );
        assert_ne!(node_uuid("node-a", uuid), uuid);
    }

    #[test]
    fn name_lists_do_not_run_together() {
        assert_ne!(
            name_based_uuid("MIG", &["ab", "c"]),
            name_based_uuid("MIG", &["a", "bc"])
        );
        assert_eq!(name_based_uuid("", &["x"]).len(), 36);
    }
}
