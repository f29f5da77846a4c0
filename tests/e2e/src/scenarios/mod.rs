//! The scenarios, in the order they run. Each one cleans up after itself (its namespaces are
//! deleted and its claims unprepared), so any subset can run in any order.

mod example;
mod outcome;

mod config_check;
mod cross_driver;
mod driver_upgrade;
mod examples;
mod gang;
mod imex;
mod invalid_config;
mod kueue_cohort;
mod live;
mod monitoring;
mod mps_restart;
mod preemption;
mod priority;
mod queues;
mod quota;
mod restart;
mod rollout;
mod scavenger;
mod shared_devices;
mod sharing;
mod slices;
mod topology;
mod two_claims;

use futures::future::BoxFuture;

use crate::context::Ctx;

pub use outcome::ScenarioOutcome;

pub type ScenarioFn = for<'a> fn(&'a Ctx) -> BoxFuture<'a, anyhow::Result<ScenarioOutcome>>;

pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub run: ScenarioFn,
}

macro_rules! scenario {
    ($name:literal, $about:literal, $run:path) => {
        Scenario {
            name: $name,
            about: $about,
            run: |ctx| Box::pin($run(ctx)),
        }
    };
}

/// Every scenario, in run order.
pub fn all() -> Vec<Scenario> {
    [
        published_and_basic(),
        configs_and_resources(),
        queues_and_priorities(),
        controller_and_restarts(),
        consumable_shares(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The published slices, the monitoring rules and the basic examples.
fn published_and_basic() -> Vec<Scenario> {
    vec![
        scenario!(
            "slices",
            "ResourceSlices as published: pools, owners, dgx-h100 layout, managed-node taints",
            slices::slices
        ),
        scenario!(
            "single-gpu",
            "deploy/examples/single-gpu: one whole GPU, prepared (status.devices holds the GPU's UUID; kubectl tessera top and explain on the live cluster; the plugin's GPU metrics label the pod, a scripted-idle claim gets its GPUIdle Event) and unprepared",
            examples::single_gpu
        ),
        scenario!(
            "monitoring",
            "the chart's PrometheusRule and Grafana dashboard: every metric they query exists on the running plugins and controller",
            monitoring::monitoring
        ),
        scenario!(
            "nvlink-pair",
            "deploy/examples/nvlink-pair: two GPUs with the same nvlinkIsland",
            examples::nvlink_pair
        ),
        scenario!(
            "gpu-nic-aligned",
            "deploy/examples/gpu-nic-aligned: kube-scheduler lines a GPU up with another driver's NIC on pcieRoot / numaNode",
            cross_driver::gpu_nic_aligned
        ),
        scenario!(
            "mig-slice",
            "deploy/examples/mig-slice: a 1g MIG device, its MIG UUID in the container",
            examples::mig_slice
        ),
        scenario!(
            "cel-selectors",
            "deploy/examples/cel-selectors: memory, product and driverVersion selectors",
            examples::cel_selectors
        ),
        scenario!(
            "driver-upgrade",
            "a new driver version laid in a node's fake driver root under the running plugin: the plugin reads it (tessera_node_driver_reloads_total, a DriverReloaded Event on the Node), the next claim's spec and container get its libcuda.so, the claim from before keeps the old one",
            driver_upgrade::driver_upgrade
        ),
        scenario!(
            "two-claims",
            "one container with two one-GPU claims: its device nodes are both claims', and CUDA in it lists both claims' UUIDs (the checker's report)",
            two_claims::two_claims
        ),
        scenario!(
            "shared-claim",
            "deploy/examples/shared-claim: one GPU for two containers and two pods",
            examples::shared_claim
        ),
    ]
}

/// Sharing configs, NVIDIA's manifests, prioritized lists, admin access, extended resources and a refused config.
fn configs_and_resources() -> Vec<Scenario> {
    vec![
        scenario!(
            "time-slicing",
            "deploy/examples/time-slicing: FromClaim TimeSlicing config",
            examples::time_slicing
        ),
        scenario!(
            "mps",
            "deploy/examples/mps: FromClaim MPS config",
            examples::mps
        ),
        scenario!(
            "nvidia-mps",
            "deploy/examples/nvidia-mps: NVIDIA's resource.nvidia.com/v1beta1 MPS config prepares MPS",
            examples::nvidia_mps
        ),
        scenario!(
            "nvidia-quickstart",
            "deploy/examples/nvidia-quickstart: an NVIDIA quickstart manifest after tessera migrate",
            examples::nvidia_quickstart
        ),
        scenario!(
            "nvidia-selectors",
            "deploy/examples/nvidia-selectors: NVIDIA's selectors demo after tessera migrate (memory, compute capability, a Hopper pair)",
            shared_devices::nvidia_selectors
        ),
        scenario!(
            "prioritized-list",
            "deploy/examples/prioritized-list: firstAvailable picks the H100 subrequest",
            examples::prioritized_list
        ),
        scenario!(
            "admin-access",
            "deploy/examples/admin-access: every GPU of a node with adminAccess",
            examples::admin_access
        ),
        scenario!(
            "extended-resource-gpu",
            "deploy/examples/extended-resource-gpu: limits nvidia.com/gpu: 2, no claims, runs unchanged",
            examples::extended_resource_gpu
        ),
        scenario!(
            "extended-resource-mig",
            "deploy/examples/extended-resource-mig: limits nvidia.com/mig-1g.10gb: 1 gets a 1g.10gb MIG device",
            examples::extended_resource_mig
        ),
        scenario!(
            "extended-resource-gated",
            "gated pod with nvidia.com/gpu: 4: the controller leaves it to the scheduler (LeftToScheduler), it runs",
            examples::extended_resource_gated
        ),
        scenario!(
            "invalid-config",
            "deploy/examples/invalid-config (opted out of the admission check): prepare refused, the pod event names the field",
            invalid_config::invalid_config
        ),
        scenario!(
            "config-refused",
            "deploy/examples/invalid-config's template without its opt-out label, and a claim with its config, are refused at a server-side apply with tessera validate's message; opted out, or valid, they are created",
            config_check::config_refused
        ),
    ]
}

/// The topology-aware controller with queues, quotas, priorities and preemption.
fn queues_and_priorities() -> Vec<Scenario> {
    vec![
        scenario!(
            "foreign-gate",
            "a gated 4-GPU pod that another gate (example.com/hold) also holds gets no allocation (condition WaitingForGates names the gate) until that gate is removed, then lands on one NVLink island",
            queues::foreign_gate
        ),
        scenario!(
            "kueue-quota",
            "Kueue (local-up --kueue) with a 4-GPU ClusterQueue: a Job's 4-GPU pod is admitted and placed on one island; a plain pod over quota waits with Kueue's gate, never allocated, until the Job goes",
            queues::kueue_quota
        ),
        scenario!(
            "kueue-cohort",
            "Kueue (local-up --kueue): two teams' ClusterQueues of 4 GPUs in one cohort; team A's Job of two 4-GPU pods is admitted by borrowing and each pod lands on one NVLink island; team B reclaims its quota, A's Job is evicted whole and B's pod lands on one island",
            kueue_cohort::kueue_cohort
        ),
        scenario!(
            "device-plugin-conversion",
            "an unchanged nvidia.com/gpu: 4 pod in a namespace labelled for the conversion gets a claim from tessera-gpu-4 and the gate, lands on one NVLink island and NUMA node; in another namespace it stays as written and runs",
            queues::device_plugin_conversion
        ),
        scenario!(
            "gpu-quota",
            "deploy/examples/gpu-quota: a namespace's ResourceQuota of 4 GPUs; a fifth (claim, device-plugin pod, template claim) is refused naming the quota",
            quota::gpu_quota
        ),
        scenario!(
            "scavenger",
            "deploy/examples/scavenger: priority -10 batch pods fill the managed GPUs; a priority-1000 gang of two 4-GPU pods evicts eight (Preempted events naming it), both pods land on one island, one NUMA node each; the batch comes back when the gang goes",
            scavenger::scavenger
        ),
        scenario!(
            "priority-order",
            "two gated 4-GPU pods wait for the managed node's NVLink island: the priority-500 one, arrived second, is ahead in explain's queue and gets gpu-0..3 when the blocker goes; the priority-100 one keeps waiting",
            priority::priority_order
        ),
        scenario!(
            "preempt-pods",
            "a priority-1000 4-GPU pod on a full managed node evicts the two priority-0 2-GPU pods of one NUMA node (Preempted events naming it, its Preempting event naming them) and lands on gpu-0..3, one island and NUMA node; the others keep running",
            preemption::preempt_pods
        ),
        scenario!(
            "preempt-pdb",
            "preempt-pods with a PodDisruptionBudget allowing 0 disruptions of the two victims: nothing is evicted, the preemptor waits and its event and explain --pod name the budget",
            preemption::preempt_pdb
        ),
        scenario!(
            "preempt-gang",
            "a priority-1000 gang of two 2-GPU pods evicts a whole priority-0 gang (both members, though one would free enough) and both its pods are placed",
            preemption::preempt_gang
        ),
    ]
}

/// The topology-aware controller's placement (gangs included), then plugin restarts.
fn controller_and_restarts() -> Vec<Scenario> {
    vec![
        scenario!(
            "topology-aware",
            "deploy/examples/topology-aware: the controller places a gated 4-GPU pod",
            topology::topology_aware
        ),
        scenario!(
            "topology-fragmented",
            "fragmented dgx-h100: controller picks gpu-4..7, first fit shown for comparison",
            topology::topology_fragmented
        ),
        scenario!(
            "gang",
            "gangs (a PodGroup and the label fallback): 2 × 4 GPUs on one rack, a gang that does not fit waits unallocated then runs, minCount never met",
            gang::gang
        ),
        scenario!(
            "plugin-restart",
            "plugin SIGKILLed while pods are prepared, restarted: everything converges",
            restart::plugin_restart
        ),
        scenario!(
            "mps-restart",
            "MPS claim: its daemon pod outlives a plugin rollout and pod deletion; unprepare stops it",
            mps_restart::mps_restart
        ),
        scenario!(
            "imex",
            "IMEX domains on a gb200 clique (local-up --layout gb200): a 4-pod job shares one channel and a daemon per node naming its peers, a failing daemon holds its node's pod, two jobs at once get two channels, nothing left after",
            imex::imex
        ),
        scenario!(
            "plugin-rollout",
            "helm-installed plugin rolled out (surge) on a node while two loops create and delete pods with claims there: the kubelet counts no failed prepare or unprepare and no prepare over 2 s",
            rollout::plugin_rollout
        ),
    ]
}

/// Consumable shares.
fn consumable_shares() -> Vec<Scenario> {
    vec![
        scenario!(
            "shares-memory",
            "consumable shares `memory`: 3 Deployment replicas asking 20Gi share one H100, a whole-GPU claim gets another",
            sharing::shares_memory
        ),
        scenario!(
            "shares-replicas",
            "consumable shares `4`: four one-share pods run on gpu-0, the fifth waits Unschedulable until one goes",
            sharing::shares_replicas
        ),
        scenario!(
            "shares-unlimited",
            "consumable shares `unlimited`: seven claims (six asking no memory, one 20Gi) share gpu-0",
            shared_devices::shares_unlimited
        ),
        scenario!(
            "shares-mig",
            "consumable shares `2` on the MIG node: two 1g.10gb claims share one MIG device, a third gets another",
            shared_devices::shares_mig
        ),
        scenario!(
            "extended-resource-shared",
            "limits nvidia.com/gpu.shared: 1, no claims: two pods share one GPU of a `4`-shares node",
            shared_devices::extended_resource_shared
        ),
        scenario!(
            "nvidia-shares-integer",
            "deploy/examples/nvidia-shares-integer: NVIDIA's integer-sharing demo after tessera migrate, 4 replicas on one GPU",
            shared_devices::nvidia_shares_integer
        ),
        scenario!(
            "nvidia-shares-memory",
            "deploy/examples/nvidia-shares-memory: NVIDIA's memory-sharing demo after tessera migrate, 4Gi replicas on one GPU",
            shared_devices::nvidia_shares_memory
        ),
    ]
}

/// Picks scenarios by name, keeping run order; unknown names are an error listing the known ones.
pub fn select(names: &[String], except: &[String]) -> anyhow::Result<Vec<Scenario>> {
    let all = all();
    let known: Vec<&str> = all.iter().map(|s| s.name).collect();
    for name in names.iter().chain(except) {
        anyhow::ensure!(
            known.contains(&name.as_str()),
            "unknown scenario `{name}`; known: {}",
            known.join(", ")
        );
    }
    Ok(all
        .into_iter()
        .filter(|s| names.is_empty() || names.iter().any(|n| n == s.name))
        .filter(|s| !except.iter().any(|n| n == s.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_selection_keeps_run_order() {
        let names: Vec<&str> = all().iter().map(|s| s.name).collect();
        let unique: std::collections::BTreeSet<&&str> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        let picked = select(&["plugin-restart".to_owned(), "slices".to_owned()], &[]).unwrap();
        let picked: Vec<&str> = picked.iter().map(|s| s.name).collect();
        assert_eq!(picked, ["slices", "plugin-restart"]);
        let error = select(&["nope".to_owned()], &[]).err().unwrap().to_string();
        assert!(
            error.contains("unknown scenario `nope`") && error.contains("single-gpu"),
            "{error}"
        );
    }

    #[test]
    fn except_leaves_scenarios_out_and_refuses_unknown_names() {
        let all_but = select(&[], &["imex".to_owned()]).unwrap();
        assert_eq!(all_but.len(), all().len() - 1);
        assert!(all_but.iter().all(|s| s.name != "imex"));
        let error = select(&[], &["nope".to_owned()]).err().unwrap().to_string();
        assert!(error.contains("unknown scenario `nope`"), "{error}");
    }

    #[test]
    fn every_example_directory_has_a_scenario() {
        let examples =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples");
        let names: Vec<&str> = all().iter().map(|s| s.name).collect();
        for entry in std::fs::read_dir(examples).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let example = path.file_name().unwrap().to_str().unwrap().to_owned();
                assert!(
                    names.contains(&example.as_str()),
                    "deploy/examples/{example} has no scenario"
                );
            }
        }
    }
}
