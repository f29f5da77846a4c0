//! The CDI spec of a prepared claim (pure): one spec per claim, vendor `gpu.tessera.dev`, class
//! `claim`, one CDI device per allocated device named `<claim uid>-<device name>`.
//!
//! - Spec-level edits (applied once when a container gets any device of the claim): the
//!   driver's control nodes `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, and —
//!   with a driver root — the driver's files and the loader-cache hook
//!   ([`crate::injection::DriverInjection`]). A container that gets devices of two claims gets
//!   these twice; the runtime keeps one mount per container path and the hook is idempotent.
//! - Per device: `/dev/nvidia<minor>` of the (parent) GPU; for a MIG device also its GPU- and
//!   compute-instance capability nodes `/dev/nvidia-caps/nvidia-cap<N>` (host paths under the
//!   device root when it is not `/`);
//!   no device list in the environment (below).
//! - Which GPUs a container's CUDA sees follows from the device nodes it got, not from a variable:
//!   libcuda enumerates the GPUs whose `/dev/nvidia<minor>` the container can open, and of a MIG
//!   GPU the MIG devices whose two capability nodes it can open. So a container that lists two
//!   claims (or several requests of one) sees the union of their devices. A variable cannot say
//!   that: each claim's spec is written alone (the kubelet hands the same CDI ids to every
//!   container using the claim, whatever else they use), and runtimes apply CDI env entries in
//!   order, the last value of a name winning, so per-claim `CUDA_VISIBLE_DEVICES` lists hid every
//!   claim's GPUs but the last one's. The spec-level edits set `NVIDIA_VISIBLE_DEVICES=void`,
//!   the same value in every claim's spec, as NVIDIA's container toolkit does in CDI mode: CUDA
//!   images set `NVIDIA_VISIBLE_DEVICES=all`, and a node whose default runtime is the toolkit's
//!   legacy hook would otherwise add every GPU of the node to the container.
//! - A claim's part of a shared device (consumable shares) is told in `TESSERA_GPU_MEMORY_LIMIT`
//!   (bytes consumed) and, with N shares, `TESSERA_GPU_SHARES` / `TESSERA_GPU_SHARES_TOTAL`,
//!   per request, in claim order (with several claims in one container, the last claim's values).
//! - Devices shared with MPS also get `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_LOG_DIRECTORY` and
//!   bind mounts of the claim's MPS directories from the host.
//! - An IMEX channel (the claim is an IMEX domain) is a device of its own, `<claim uid>-channel-<n>`:
//!   the channel's node `/dev/nvidia-caps-imex-channels/channel<n>` (what CUDA opens to import
//!   and export memory across nodes), `TESSERA_IMEX_CHANNEL=<n>` and `TESSERA_IMEX_DOMAIN=<claim
//!   uid>`, and the domain's directory mounted read-only at `/etc/nvidia-imex` (its `config.cfg`
//!   names the daemon's command socket there, so `nvidia-imex-ctl -q` in the container asks this
//!   node's daemon). A claim with nothing but a channel carries no spec-level edits: its
//!   containers get their GPUs, and the driver, from their GPU claims.

use tessera_api::DRIVER_NAME;
use tessera_api::imex;
use tessera_api::shares::{ENV_MEMORY_LIMIT, ENV_SHARES, ENV_SHARES_TOTAL};
use tessera_cdi::{ContainerEdits, Device, DeviceNode, Kind, Mount, NameError, Spec};
use tessera_driver_root::devices::{cap_node, gpu_node};

use crate::checkpoint::{ClaimRecord, DeviceRecord, DeviceShare, DeviceTarget, ImexRecord};
use crate::injection::DriverInjection;
use crate::mig::MigCapMinors;
use crate::sharing::{MPS_LOG_DIRECTORY_IN_CONTAINER, MPS_PIPE_DIRECTORY_IN_CONTAINER};

/// The CDI class of Tessera's per-claim specs.
pub const CDI_CLASS: &str = "claim";

/// The CDI kind of Tessera's claim specs (`gpu.tessera.dev/claim`).
pub fn kind() -> Kind {
    // Both parts are constants that satisfy the CDI naming rules (checked by a test).
    Kind::new(DRIVER_NAME, CDI_CLASS).unwrap_or_else(|e| unreachable!("{e}"))
}

/// The CDI device name of `device` in the spec of claim `claim_uid`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI device id (`gpu.tessera.dev/claim=<uid>-<device>`).
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!(
        "{DRIVER_NAME}/{CDI_CLASS}={}",
        device_name(claim_uid, device)
    )
}

/// Why a claim's spec cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiSpecError {
    /// A dynamic MIG device has not been created (a bug in the prepare order).
    #[error(
        "device `{device}` has no MIG instance yet; it must be created before its CDI spec is written"
    )]
    NoMigInstance { device: String },
    /// The driver lists no capability device for a MIG instance.
    #[error(
        "no nvidia-caps device for GPU instance {gpu_instance_id} (compute instance \
         {compute_instance_id:?}) of GPU minor {gpu_minor}, needed by device `{device}`; check \
         /proc/driver/nvidia-caps/mig-minors"
    )]
    NoCapability {
        device: String,
        gpu_minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: Option<u32>,
    },
    /// A CDI device name is not valid (a claim UID with unexpected characters).
    #[error("device `{device}` cannot be named in CDI: {source}")]
    Name { device: String, source: NameError },
}

fn bind_mount(host: &str, container: &str) -> Mount {
    Mount {
        host_path: host.to_owned(),
        container_path: container.to_owned(),
        options: vec!["rbind".into(), "rw".into(), "nosuid".into(), "nodev".into()],
        mount_type: Some("bind".into()),
    }
}

/// Fails for a MIG device whose instance does not exist yet (the spec must not be written before
/// it is created).
fn check_instance(device: &DeviceRecord) -> Result<(), CdiSpecError> {
    device
        .target
        .visible_uuid()
        .map(|_| ())
        .ok_or_else(|| CdiSpecError::NoMigInstance {
            device: device.device.clone(),
        })
}

/// The variable the spec-level edits set: NVIDIA's container toolkit, if it runs as the node's
/// runtime hook, leaves the container's devices to CDI.
pub const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";

fn device_nodes(
    device: &DeviceRecord,
    caps: &MigCapMinors,
    injection: &DriverInjection,
) -> Result<Vec<DeviceNode>, CdiSpecError> {
    let minor = device.target.gpu_minor();
    let mut nodes = vec![injection.device_node(&gpu_node(minor))];
    if let DeviceTarget::Mig { instance, .. } = &device.target {
        let instance = instance
            .as_ref()
            .ok_or_else(|| CdiSpecError::NoMigInstance {
                device: device.device.clone(),
            })?;
        let gi = instance.gpu_instance_id;
        let ci = instance.compute_instance_id;
        let missing = |compute_instance_id| CdiSpecError::NoCapability {
            device: device.device.clone(),
            gpu_minor: minor,
            gpu_instance_id: gi,
            compute_instance_id,
        };
        let gi_cap = caps.gpu_instance(minor, gi).ok_or_else(|| missing(None))?;
        let ci_cap = caps
            .compute_instance(minor, gi, ci)
            .ok_or_else(|| missing(Some(ci)))?;
        for cap in [gi_cap, ci_cap] {
            nodes.push(injection.device_node(&cap_node(cap)));
        }
    }
    Ok(nodes)
}

/// What a container is told of its part of shared devices (consumable shares): for the devices of
/// `request` in claim order, the memory consumed in bytes
/// ([`ENV_MEMORY_LIMIT`]; the device's whole memory is not known here, so a device with no
/// consumed memory is `0`), and in the N-shares mode the shares consumed and the N
/// ([`ENV_SHARES`], [`ENV_SHARES_TOTAL`]). Nothing when no device of the request is shared.
fn share_env(record: &ClaimRecord, request: &str) -> Vec<String> {
    let shares: Vec<_> = record
        .devices
        .iter()
        .filter(|d| d.request == request)
        .map(|d| d.share.as_ref())
        .collect();
    if shares.iter().all(Option::is_none) {
        return Vec::new();
    }
    let list = |value: &dyn Fn(&DeviceShare) -> Option<u64>| {
        shares
            .iter()
            .map(|s| s.and_then(value).unwrap_or(0).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut env = vec![format!("{ENV_MEMORY_LIMIT}={}", list(&|s| s.memory_bytes))];
    if shares.iter().flatten().any(|s| s.shares.is_some()) {
        env.push(format!("{ENV_SHARES}={}", list(&|s| s.shares)));
        env.push(format!("{ENV_SHARES_TOTAL}={}", list(&|s| s.total_shares)));
    }
    env
}

/// The CDI device of a claim's IMEX channel.
fn channel_device(
    claim_uid: &str,
    imex: &ImexRecord,
    injection: &DriverInjection,
) -> Result<Device, CdiSpecError> {
    let name = device_name(claim_uid, &imex.device);
    tessera_cdi::validate_device_name(&name).map_err(|source| CdiSpecError::Name {
        device: imex.device.clone(),
        source,
    })?;
    Ok(Device {
        name,
        container_edits: ContainerEdits {
            env: vec![
                format!("{}={}", imex::CHANNEL_ENV, imex.channel),
                format!("{}={claim_uid}", imex::DOMAIN_ENV),
            ],
            device_nodes: vec![injection.device_node(&imex::channel_node(imex.channel))],
            mounts: vec![Mount {
                host_path: imex.directory.clone(),
                container_path: imex::CONFIG_DIR_IN_CONTAINER.to_owned(),
                options: vec!["rbind".into(), "ro".into(), "nosuid".into(), "nodev".into()],
                mount_type: Some("bind".into()),
            }],
            ..ContainerEdits::default()
        },
    })
}

/// The spec of a claim whose devices all exist (dynamic MIG instances created).
pub fn claim_spec(
    claim_uid: &str,
    record: &ClaimRecord,
    caps: &MigCapMinors,
    injection: &DriverInjection,
) -> Result<Spec, CdiSpecError> {
    let mut devices = Vec::with_capacity(record.devices.len());
    for device in &record.devices {
        check_instance(device)?;
        let mut edits = ContainerEdits {
            device_nodes: device_nodes(device, caps, injection)?,
            ..ContainerEdits::default()
        };
        edits.env.extend(share_env(record, &device.request));
        if let Some(mps) = record.mps.as_ref().filter(|_| device.uses_mps()) {
            edits.env.push(format!(
                "CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIRECTORY_IN_CONTAINER}"
            ));
            edits.env.push(format!(
                "CUDA_MPS_LOG_DIRECTORY={MPS_LOG_DIRECTORY_IN_CONTAINER}"
            ));
            edits.mounts.push(bind_mount(
                &mps.pipe_directory,
                MPS_PIPE_DIRECTORY_IN_CONTAINER,
            ));
            edits.mounts.push(bind_mount(
                &mps.log_directory,
                MPS_LOG_DIRECTORY_IN_CONTAINER,
            ));
        }
        let name = device_name(claim_uid, &device.device);
        tessera_cdi::validate_device_name(&name).map_err(|source| CdiSpecError::Name {
            device: device.device.clone(),
            source,
        })?;
        devices.push(Device {
            name,
            container_edits: edits,
        });
    }
    if let Some(imex) = &record.imex {
        devices.push(channel_device(claim_uid, imex, injection)?);
    }
    let mut spec = Spec::new(kind(), devices);
    if !record.devices.is_empty() {
        let mut edits = ContainerEdits {
            device_nodes: injection.control_nodes.clone(),
            ..injection.edits.clone()
        };
        edits.env.push(VISIBLE_DEVICES_VOID.to_owned());
        spec.container_edits = edits;
    }
    spec.set_minimum_version();
    Ok(spec)
}

#[cfg(test)]
mod tests;
