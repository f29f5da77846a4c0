//! MPS control daemons in pods of their own (`--mps-daemons=pod`, what the chart uses), so they
//! outlive the plugin's pod: a DaemonSet rollout or a deleted plugin pod kills every process in
//! that pod's container, and a claim's containers would lose their MPS server with it.
//!
//! One bare Pod per MPS claim, `tessera-mps-<claim uid>` in the plugin's namespace, bound to this
//! node (`nodeName`, no scheduling), tolerating every taint, with the plugin's image running
//! `tessera-mps-daemon`: it starts the driver root's `nvidia-cuda-mps-control -f` (the driver root
//! mounted read-only at [`DRIVER_ROOT_IN_POD`]) with the claim's devices and directories, applies
//! the claim's settings, and on SIGTERM tells the daemon to quit. `restartPolicy: OnFailure`: a
//! daemon that crashes is restarted with its settings; one told to `quit` (the program then exits
//! 0) stays down, so nothing restarts a daemon the plugin stopped without deleting its pod (a
//! plugin switched to `--mps-daemons=process`), and the next start of its claim replaces the
//! finished pod.
//!
//! The plugin keeps no state about the pods: a claim's pod is found again by its name, a daemon is
//! known to run when it answers in the claim's pipe directory (the plugin runs the driver's control
//! client on the shared directory), and pods of claims no record knows are listed by label and
//! deleted at start. So every operation is idempotent, as recovery requires:
//!
//! - start: a daemon that answers is kept (a plugin restart finds it again); otherwise the pod is
//!   created (or, when it is finished or being deleted, replaced) and the daemon awaited; then
//!   the plugin applies the claim's settings itself (the pod's program applies them when it
//!   starts, but prepare must not answer before they are set);
//! - stop: the pod is deleted (its grace period lets the daemon quit), and the plugin waits until
//!   the daemon no longer answers; when there is no pod, a daemon that still answers (started by
//!   the plugin with `--mps-daemons=process`) is told to quit directly.
//!
//! Compared with NVIDIA's DRA driver, which creates a Deployment per claim: a bare pod needs no
//! controller round trip to appear or go, and nothing recreates it behind the plugin's back after
//! unprepare; a Deployment would also restart a daemon whose pod was evicted, which the
//! system-node-critical priority given to these pods is meant to prevent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, HostPathVolumeSource, Pod, PodSpec, SecurityContext, Toleration, Volume,
    VolumeMount,
};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use tessera_api::config::TimeSliceInterval;
use tessera_kubelet_grpc::ClaimUid;

use tessera_prepare::sharing::{
    GpuControl, MpsDaemon, MpsDirectories, SharingError, SystemGpuControl,
};

/// Where the driver root is mounted in an MPS daemon pod.
pub const DRIVER_ROOT_IN_POD: &str = "/driver-root";
/// The program the pod runs (in the plugin's image).
pub const DAEMON_PROGRAM: &str = "/usr/local/bin/tessera-mps-daemon";
/// Label naming the claim a daemon pod serves.
pub const CLAIM_LABEL: &str = "gpu.tessera.dev/mps-claim";
/// Label naming the node a daemon pod runs on.
pub const NODE_LABEL: &str = "gpu.tessera.dev/node";
const COMPONENT: &str = "mps-control-daemon";
/// How long a daemon pod may take to answer (the kubelet gives prepare 45 s).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a deleted pod's daemon may take to stop answering.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(100);

/// What every daemon pod of this node has in common.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsPodTemplate {
    pub node_name: String,
    /// The plugin's namespace.
    pub namespace: String,
    /// The plugin's image (it holds `tessera-mps-daemon`).
    pub image: String,
    pub priority_class: Option<String>,
    /// Privileged (real GPUs: the daemon opens every GPU device node).
    pub privileged: bool,
    /// The driver root on the host.
    pub driver_root: PathBuf,
    /// The device root on the host; mounted at its own path when it is not `/`.
    pub dev_root: PathBuf,
    /// `nvidia-cuda-mps-control` in the driver root.
    pub control: PathBuf,
    /// The driver's library directories in the driver root.
    pub library_dirs: Vec<PathBuf>,
}

/// The pod of claim `claim_uid`.
pub fn pod_name(claim_uid: &str) -> String {
    format!("tessera-mps-{claim_uid}")
}

fn in_pod(path: &Path) -> String {
    Path::new(DRIVER_ROOT_IN_POD)
        .join(path.strip_prefix("/").unwrap_or(path))
        .display()
        .to_string()
}

fn host_path(name: &str, path: &Path, mount_at: &str, read_only: bool) -> (Volume, VolumeMount) {
    (
        Volume {
            name: name.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("Directory".to_owned()),
            }),
            ..Volume::default()
        },
        VolumeMount {
            name: name.to_owned(),
            mount_path: mount_at.to_owned(),
            read_only: Some(read_only),
            ..VolumeMount::default()
        },
    )
}

/// The pod that runs `daemon` (pure).
pub fn daemon_pod(template: &MpsPodTemplate, daemon: &MpsDaemon) -> Pod {
    let (volumes, volume_mounts) = daemon_volumes(template, daemon);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&daemon.claim_uid)),
            namespace: Some(template.namespace.clone()),
            labels: Some(daemon_labels(template, daemon)),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(template.node_name.clone()),
            restart_policy: Some("OnFailure".to_owned()),
            automount_service_account_token: Some(false),
            // MPS clients in other pods talk to the server by process id.
            host_pid: Some(true),
            priority_class_name: template.priority_class.clone(),
            termination_grace_period_seconds: Some(10),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            }]),
            containers: vec![daemon_container(template, daemon, volume_mounts)],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The daemon pod's one container: `tessera-mps-daemon` with the daemon's flags and the
/// MPS environment.
fn daemon_container(
    template: &MpsPodTemplate,
    daemon: &MpsDaemon,
    volume_mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: COMPONENT.to_owned(),
        image: Some(template.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(vec![DAEMON_PROGRAM.to_owned()]),
        args: Some(daemon_args(template, daemon)),
        env: Some(daemon_env(daemon)),
        security_context: Some(SecurityContext {
            privileged: Some(template.privileged),
            run_as_user: Some(0),
            read_only_root_filesystem: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    }
}

/// `tessera-mps-daemon`'s flags: the control binary and libraries inside the pod, the
/// thread percentage and each device's pinned-memory limit.
fn daemon_args(template: &MpsPodTemplate, daemon: &MpsDaemon) -> Vec<String> {
    let mut args = vec![
        "--control".to_owned(),
        in_pod(&template.control),
        "--library-path".to_owned(),
        template
            .library_dirs
            .iter()
            .map(|d| in_pod(d))
            .collect::<Vec<_>>()
            .join(":"),
    ];
    if let Some(pct) = daemon.active_thread_percentage {
        args.extend(["--active-thread-percentage".to_owned(), pct.to_string()]);
    }
    for (index, device) in daemon.devices.iter().enumerate() {
        if let Some(bytes) = device.pinned_memory_limit_bytes {
            args.extend([
                "--pinned-mem-limit".to_owned(),
                format!("{index}={}M", bytes.div_ceil(1 << 20)),
            ]);
        }
    }
    args
}

/// The MPS environment: the daemon's GPUs and its pipe and log directories.
fn daemon_env(daemon: &MpsDaemon) -> Vec<EnvVar> {
    let env = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        ..EnvVar::default()
    };
    let devices: Vec<&str> = daemon.devices.iter().map(|d| d.uuid.as_str()).collect();
    vec![
        env("CUDA_VISIBLE_DEVICES", devices.join(",")),
        env(
            "CUDA_MPS_PIPE_DIRECTORY",
            daemon.directories.pipe.display().to_string(),
        ),
        env(
            "CUDA_MPS_LOG_DIRECTORY",
            daemon.directories.log.display().to_string(),
        ),
    ]
}

/// The host directories the daemon needs: the driver root (read-only), the claim's MPS
/// directory and, when devices live elsewhere than `/dev`, the device root.
fn daemon_volumes(
    template: &MpsPodTemplate,
    daemon: &MpsDaemon,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    // The claim's MPS directory holds the pipe and log directories; mounted at its host path,
    // which the claim's containers and the plugin use too.
    let claim_dir = daemon
        .directories
        .pipe
        .parent()
        .unwrap_or(&daemon.directories.pipe)
        .to_path_buf();
    let mut mounts = vec![
        host_path(
            "driver-root",
            &template.driver_root,
            DRIVER_ROOT_IN_POD,
            true,
        ),
        host_path("mps", &claim_dir, &claim_dir.display().to_string(), false),
    ];
    if template.dev_root != Path::new("/") {
        mounts.push(host_path(
            "dev-root",
            &template.dev_root,
            &template.dev_root.display().to_string(),
            true,
        ));
    }
    mounts.into_iter().unzip()
}

/// The labels the plugin finds its daemon pods by (node and claim).
fn daemon_labels(template: &MpsPodTemplate, daemon: &MpsDaemon) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "tessera".to_owned()),
        (
            "app.kubernetes.io/component".to_owned(),
            COMPONENT.to_owned(),
        ),
        (NODE_LABEL.to_owned(), template.node_name.clone()),
        (CLAIM_LABEL.to_owned(), daemon.claim_uid.clone()),
    ])
}

/// The claim a claim's MPS directories belong to: `<mps root>/<claim uid>/pipe`.
fn claim_of(directories: &MpsDirectories) -> Option<String> {
    directories
        .pipe
        .parent()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Why a pod will not run, if its status says so.
fn broken(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() == Some("Failed") {
        return Some(format!(
            "the pod failed: {}",
            status.message.clone().unwrap_or_default()
        ));
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            matches!(
                w.reason.as_deref(),
                Some(
                    "ErrImagePull"
                        | "ImagePullBackOff"
                        | "InvalidImageName"
                        | "CreateContainerConfigError"
                        | "CreateContainerError"
                        | "CrashLoopBackOff"
                )
            )
        })
        .map(|w| {
            format!(
                "{}: {}",
                w.reason.clone().unwrap_or_default(),
                w.message.clone().unwrap_or_default()
            )
        })
}

/// [`GpuControl`] with MPS daemons in pods; time slices through the driver's `nvidia-smi`.
#[derive(Clone)]
pub struct PodMpsControl {
    tools: SystemGpuControl,
    pods: Api<Pod>,
    runtime: tokio::runtime::Handle,
    template: MpsPodTemplate,
}

impl PodMpsControl {
    /// `tools` run the driver's programs in this process (time slices, the MPS control client);
    /// `runtime` runs the API calls (the methods are called from blocking threads).
    pub fn new(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        tools: SystemGpuControl,
        template: MpsPodTemplate,
    ) -> Self {
        PodMpsControl {
            pods: Api::namespaced(client, &template.namespace),
            runtime,
            tools,
            template,
        }
    }

    fn api_error(claim: &str, action: &str, e: kube::Error) -> String {
        format!("{action} the MPS daemon pod {}: {e}", pod_name(claim))
    }

    /// Makes sure the claim's pod exists and is not finished or being deleted.
    fn ensure_pod(&self, daemon: &MpsDaemon) -> Result<(), String> {
        let name = pod_name(&daemon.claim_uid);
        let claim = &daemon.claim_uid;
        self.runtime.block_on(async {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let existing = self
                    .pods
                    .get_opt(&name)
                    .await
                    .map_err(|e| Self::api_error(claim, "reading", e))?;
                let Some(pod) = existing else {
                    match self
                        .pods
                        .create(&PostParams::default(), &daemon_pod(&self.template, daemon))
                        .await
                    {
                        Ok(_) => return Ok(()),
                        // Created concurrently: look again.
                        Err(kube::Error::Api(e)) if e.code == 409 => continue,
                        Err(e) => return Err(Self::api_error(claim, "creating", e)),
                    }
                };
                let finished = pod.metadata.deletion_timestamp.is_some()
                    || matches!(
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    );
                if !finished {
                    return Ok(());
                }
                if pod.metadata.deletion_timestamp.is_none() {
                    match self.pods.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => return Err(Self::api_error(claim, "replacing", e)),
                    }
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the old MPS daemon pod {name} is still being deleted"
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        })
    }

    /// Waits until the claim's daemon answers; fails early when its pod cannot run.
    fn wait_until_answering(&self, daemon: &MpsDaemon) -> Result<(), String> {
        let name = pod_name(&daemon.claim_uid);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut checked = Instant::now();
        loop {
            if self.tools.daemon_answers(&daemon.directories) {
                return Ok(());
            }
            if checked.elapsed() > Duration::from_secs(1) {
                checked = Instant::now();
                let pod = self
                    .runtime
                    .block_on(self.pods.get_opt(&name))
                    .map_err(|e| Self::api_error(&daemon.claim_uid, "reading", e))?;
                match pod {
                    None => return Err(format!("the MPS daemon pod {name} disappeared")),
                    Some(pod) => {
                        if let Some(reason) = broken(&pod) {
                            return Err(format!("the MPS daemon pod {name} cannot run: {reason}"));
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the MPS daemon of pod {name} did not answer in {} within {START_TIMEOUT:?}",
                    daemon.directories.pipe.display()
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

impl GpuControl for PodMpsControl {
    fn set_time_slice(
        &self,
        gpu_uuid: &str,
        interval: TimeSliceInterval,
    ) -> Result<(), SharingError> {
        self.tools.set_time_slice(gpu_uuid, interval)
    }

    fn start_mps(&self, daemon: &MpsDaemon) -> Result<(), SharingError> {
        let failed = |reason: String| SharingError::StartMps {
            claim_uid: daemon.claim_uid.clone(),
            pipe: daemon.directories.pipe.clone(),
            reason,
        };
        for dir in [&daemon.directories.pipe, &daemon.directories.log] {
            std::fs::create_dir_all(dir)
                .map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
        }
        // A daemon that answers is this claim's, from before a plugin restart: keep it.
        if !self.tools.daemon_answers(&daemon.directories) {
            self.ensure_pod(daemon).map_err(failed)?;
            self.wait_until_answering(daemon).map_err(failed)?;
        }
        // The pod's program applies the settings too, but perhaps not yet: the claim's
        // containers must not start before they are set.
        self.tools.configure(daemon).map_err(failed)
    }

    fn stop_mps(&self, directories: &MpsDirectories) -> Result<(), SharingError> {
        let failed = |reason: String| SharingError::StopMps {
            pipe: directories.pipe.clone(),
            reason,
        };
        let Some(claim) = claim_of(directories) else {
            return Err(failed("the pipe directory names no claim".into()));
        };
        let name = pod_name(&claim);
        let deleted = self.runtime.block_on(async {
            match self.pods.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(Self::api_error(&claim, "deleting", e)),
            }
        });
        if !deleted.map_err(failed)? {
            // No pod: a daemon that still answers was not started in one (the plugin ran with
            // --mps-daemons=process when the claim was prepared); stop it directly rather than
            // wait for a pod deletion that will not come.
            return self.tools.stop_mps(directories);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while directories.pipe.is_dir() && self.tools.daemon_answers(directories) {
            if Instant::now() > deadline {
                // The pod is gone but the daemon answers (its container outlived the pod?):
                // ask it directly.
                return self.tools.stop_mps(directories);
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    fn mps_daemon_claims(&self) -> Result<Vec<ClaimUid>, SharingError> {
        let selector = format!(
            "app.kubernetes.io/component={COMPONENT},{NODE_LABEL}={}",
            self.template.node_name
        );
        let pods = self
            .runtime
            .block_on(self.pods.list(&ListParams::default().labels(&selector)))
            .map_err(|e| SharingError::StopMps {
                pipe: PathBuf::new(),
                reason: format!("listing the MPS daemon pods ({selector}): {e}"),
            })?;
        Ok(pods
            .items
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(CLAIM_LABEL))
            .map(ClaimUid::new)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_prepare::sharing::MpsDevice;

    fn template(dev_root: &str) -> MpsPodTemplate {
        MpsPodTemplate {
            node_name: "node-a".into(),
            namespace: "tessera-system".into(),
            image: "ghcr.io/tessera-dev/tessera:0.1.0".into(),
            priority_class: Some("system-node-critical".into()),
            privileged: true,
            driver_root: "/run/nvidia/driver".into(),
            dev_root: dev_root.into(),
            control: "/usr/bin/nvidia-cuda-mps-control".into(),
            library_dirs: vec!["/usr/lib/x86_64-linux-gnu".into()],
        }
    }

    fn daemon() -> MpsDaemon {
        MpsDaemon {
            claim_uid: "4f7c2a10-0000-4000-8000-00000000000a".into(),
            directories: MpsDirectories {
                pipe: "/var/lib/tessera/mps/4f7c2a10-0000-4000-8000-00000000000a/pipe".into(),
                log: "/var/lib/tessera/mps/4f7c2a10-0000-4000-8000-00000000000a/log".into(),
            },
            devices: vec![
                MpsDevice {
                    uuid: "GPU-1".into(),
                    pinned_memory_limit_bytes: None,
                },
                MpsDevice {
                    uuid: "MIG-2".into(),
                    pinned_memory_limit_bytes: Some((1 << 30) + 1),
                },
            ],
            active_thread_percentage: Some(25),
        }
    }

    #[test]
    fn the_pod_runs_the_drivers_daemon_with_the_claims_settings_on_this_node() {
        let pod = daemon_pod(&template("/"), &daemon());
        let json = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            json["metadata"]["name"],
            "tessera-mps-4f7c2a10-0000-4000-8000-00000000000a"
        );
        assert_eq!(
            json["metadata"]["labels"][CLAIM_LABEL],
            "4f7c2a10-0000-4000-8000-00000000000a"
        );
        assert_eq!(json["spec"]["nodeName"], "node-a");
        assert_eq!(json["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(json["spec"]["hostPID"], true);
        assert_eq!(json["spec"]["tolerations"][0]["operator"], "Exists");
        let container = &json["spec"]["containers"][0];
        assert_eq!(container["command"][0], DAEMON_PROGRAM);
        assert_eq!(
            container["args"],
            serde_json::json!([
                "--control",
                "/driver-root/usr/bin/nvidia-cuda-mps-control",
                "--library-path",
                "/driver-root/usr/lib/x86_64-linux-gnu",
                "--active-thread-percentage",
                "25",
                "--pinned-mem-limit",
                "1=1025M"
            ])
        );
        assert_eq!(container["env"][0]["value"], "GPU-1,MIG-2");
        assert_eq!(
            container["env"][1]["value"],
            "/var/lib/tessera/mps/4f7c2a10-0000-4000-8000-00000000000a/pipe"
        );
        let volumes: Vec<&str> = json["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["hostPath"]["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            volumes,
            vec![
                "/run/nvidia/driver",
                "/var/lib/tessera/mps/4f7c2a10-0000-4000-8000-00000000000a"
            ]
        );
        let with_dev_root = daemon_pod(&template("/var/lib/mock/dev-root"), &daemon());
        let mounts = &with_dev_root.spec.unwrap().containers[0]
            .volume_mounts
            .clone()
            .unwrap();
        assert_eq!(mounts[2].mount_path, "/var/lib/mock/dev-root");
        assert_eq!(
            claim_of(&daemon().directories).as_deref(),
            Some("4f7c2a10-0000-4000-8000-00000000000a")
        );
    }
}
