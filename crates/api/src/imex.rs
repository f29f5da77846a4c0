//! IMEX (multi-node NVLink) names: the channels Tessera publishes per fabric clique, the class
//! that selects them, and what a container of a domain gets. docs/user-guide.md, "Jobs across
//! NVLink racks (IMEX)", explains the design; this module only spells the names once.
//!
//! A job asks for one IMEX domain by giving all its pods one shared ResourceClaim with one request
//! of class [`IMEX_DEVICE_CLASS`]: the claim is the domain. Its device is one channel of a fabric
//! clique, published by the controller as a network-attached device of pool
//! `imex-<clique>` ([`pool_name`]) whose slice selects the clique's nodes, so every pod of the
//! claim lands in that clique and no other claim gets the same channel until this one is
//! deallocated.

/// Shipped DeviceClass selecting IMEX channels.
pub const IMEX_DEVICE_CLASS: &str = "imex.gpu.tessera.dev";

/// The `type` attribute of a channel device.
pub const CHANNEL_TYPE: &str = "imex-channel";

/// The channel number attribute (int) of a channel device.
pub const CHANNEL_ATTRIBUTE: &str = "channel";

/// Prefix of the pools of channel devices: `imex-<clique>`.
pub const POOL_PREFIX: &str = "imex-";

/// Prefix of channel device names: `channel-<n>`.
pub const DEVICE_PREFIX: &str = "channel-";

/// Channels published per clique unless configured otherwise (one slice holds at most 128
/// devices). A node runs one IMEX daemon, so a clique of N nodes has at most N domains at once.
pub const DEFAULT_CHANNELS: u32 = 128;

/// The most channels the driver offers per node (`/dev/nvidia-caps-imex-channels/channel0..2047`).
pub const MAX_CHANNELS: u32 = 2048;

/// Node annotation naming the address a node's IMEX daemon uses (peers' nodes configs list it);
/// absent: the node's first `InternalIP`.
pub const ADDRESS_ANNOTATION: &str = "gpu.tessera.dev/imex-address";

/// Where the driver's channel device nodes live.
pub const CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// Container environment: the channel number a domain's containers share.
pub const CHANNEL_ENV: &str = "TESSERA_IMEX_CHANNEL";

/// Container environment: the domain (the UID of the channel claim).
pub const DOMAIN_ENV: &str = "TESSERA_IMEX_DOMAIN";

/// Where a domain's IMEX configuration (and its daemon's command socket) is mounted in the
/// daemon's pod and in the domain's containers: `nvidia-imex-ctl -q` there asks the node's daemon.
pub const CONFIG_DIR_IN_CONTAINER: &str = "/etc/nvidia-imex";

/// The name part of the condition each node writes on a domain's claim (on its channel's
/// `status.devices` entry) about its IMEX daemon: the type is `<node>/IMEXDaemonReady`, `True`
/// while the node's daemon answers `READY`.
pub const DAEMON_CONDITION: &str = "IMEXDaemonReady";

/// The pool of the channels of fabric clique `clique` (`<clusterUUID>.<cliqueId>`).
pub fn pool_name(clique: &str) -> String {
    format!("{POOL_PREFIX}{clique}")
}

/// The clique of a channel pool, or `None` for any other pool.
pub fn clique_of_pool(pool: &str) -> Option<&str> {
    pool.strip_prefix(POOL_PREFIX).filter(|c| !c.is_empty())
}

/// The device name of channel `n`.
pub fn device_name(channel: u32) -> String {
    format!("{DEVICE_PREFIX}{channel}")
}

/// The channel number of a channel device name (`channel-7` → 7; no leading zeros, as written).
pub fn channel_of_device(device: &str) -> Option<u32> {
    let digits = device.strip_prefix(DEVICE_PREFIX)?;
    let n: u32 = digits.parse().ok()?;
    (n.to_string() == digits && n < MAX_CHANNELS).then_some(n)
}

/// The device node of channel `n`, as a container sees it.
pub fn channel_node(channel: u32) -> String {
    format!("{CHANNEL_DIR}/channel{channel}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let pool = pool_name("522c88f3-2731-5718-acd9-980cbf3d0f20.32766");
        assert_eq!(pool, "imex-522c88f3-2731-5718-acd9-980cbf3d0f20.32766");
        assert_eq!(
            clique_of_pool(&pool),
            Some("522c88f3-2731-5718-acd9-980cbf3d0f20.32766")
        );
        assert_eq!(clique_of_pool("node-a"), None);
        assert_eq!(clique_of_pool("imex-"), None);
        assert_eq!(channel_of_device(&device_name(7)), Some(7));
        assert_eq!(channel_of_device("channel-07"), None);
        assert_eq!(channel_of_device("channel-2048"), None);
        assert_eq!(channel_of_device("gpu-0"), None);
        assert_eq!(channel_node(3), "/dev/nvidia-caps-imex-channels/channel3");
    }
}
