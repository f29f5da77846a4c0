//! Memory of the real `tessera-kubelet-plugin` process (release build): resident set size
//! (`VmRSS`) and its peak (`VmHWM`) from `/proc/<pid>/status`, idle after it registered and
//! published its pool, and after 1,000 prepare/unprepare cycles driven by the kubelet
//! simulator over its unix sockets. The plugin talks to the in-process API-server fake over
//! loopback HTTP, serves /metrics, and rescans its (mock, dgx-h100) inventory every 30 s, as
//! deployed; sharing is simulated under the state directory.
//!
//! ```text
//! cargo bench -p tessera-node --bench plugin_rss
//! TESSERA_BENCH_CYCLES=5000 cargo bench -p tessera-node --bench plugin_rss
//! ```
//!
//! Prints a markdown table and writes `node-plugin-rss.json` and `node-plugin-rss.md` under
//! Cargo's benchmark temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use tessera_api::DRIVER_NAME;
use tessera_fake_apiserver::FakeApiServer;
use tessera_kubelet_grpc::ClaimRef;
use tessera_kubelet_grpc::simulator::KubeletSimulator;

const NODE: &str = "node-a";
const SETTLE: Duration = Duration::from_secs(3);

/// One memory reading of a process, in KiB.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Memory {
    rss_kib: u64,
    peak_rss_kib: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_rss_kib: field("VmHWM:"),
    }
}

/// Claims for gpu-0..gpu-7: whole GPUs, every third with MPS, every fourth time-sliced.
fn claim(index: usize) -> (ResourceClaim, ClaimRef) {
    let name = format!("rss-{index}");
    let uid = format!("0e550000-0000-4000-8000-{index:012}");
    let sharing = match index % 4 {
        1 => Some(json!({"strategy": "MPS"})),
        3 => Some(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})),
        _ => None,
    };
    let configs: Vec<Value> = sharing
        .map(|sharing| {
            vec![json!({"source": "FromClaim", "requests": [],
                "opaque": {"driver": DRIVER_NAME, "parameters": {
                    "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing}}})]
        })
        .unwrap_or_default();
    let object = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "bench", "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": NODE,
                         "device": format!("gpu-{index}")}],
            "config": configs}},
          "reservedFor": [{"resource": "pods", "name": "p", "uid": "p"}]},
    }))
    .expect("a valid claim");
    (object, ClaimRef::new("bench", name, uid))
}

fn start_plugin(kubeconfig: &Path, root: &Path) -> Child {
    let log = std::fs::File::create(root.join("plugin.log")).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_tessera-kubelet-plugin"))
        .args(["--node-name", NODE, "--topology", "dgx-h100"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--kubelet-registrar-directory-path")
        .arg(root.join("reg"))
        .arg("--kubelet-plugins-directory-path")
        .arg(root.join("plugins"))
        .arg("--cdi-root")
        .arg(root.join("cdi"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .args(["--metrics-address", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start tessera-kubelet-plugin")
}

async fn register(socket: &Path, plugin: &mut Child) -> KubeletSimulator {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = plugin.try_wait().expect("plugin status") {
            panic!("the plugin exited: {status}");
        }
        if socket.exists()
            && let Ok(kubelet) = KubeletSimulator::register(socket).await
        {
            return kubelet;
        }
        assert!(Instant::now() < deadline, "the plugin did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, serde::Serialize)]
struct Report {
    cycles: usize,
    claims_per_cycle: usize,
    idle: Memory,
    after_cycles: Memory,
    after_cycles_settled: Memory,
    cycles_seconds: f64,
}

async fn measure(cycles: usize) -> Report {
    let server = FakeApiServer::new();
    let http = server.serve_http().await.expect("serve the fake over HTTP");
    server.seed(&Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    });
    let claims: Vec<ClaimRef> = (0..8)
        .map(|i| {
            let (object, reference) = claim(i);
            server.seed(&object);
            reference
        })
        .collect();
    let shm = Path::new("/dev/shm");
    let root = tempfile::Builder::new()
        .prefix("tkp-rss")
        .tempdir_in(if shm.is_dir() { shm } else { Path::new("/tmp") })
        .expect("temporary directory");
    let mut plugin = start_plugin(http.kubeconfig_path(), root.path());
    let socket: PathBuf = root.path().join("reg").join("gpu.tessera.dev-reg.sock");
    let kubelet = register(&socket, &mut plugin).await;
    // Let the first publish and the health stream set-up finish.
    tokio::time::sleep(SETTLE).await;
    let idle = memory(plugin.id());

    let batch = 4;
    let started = Instant::now();
    for cycle in 0..cycles {
        let chosen: Vec<ClaimRef> = (0..batch)
            .map(|k| claims[(cycle + k * 2) % claims.len()].clone())
            .collect();
        let prepared = kubelet.prepare(&chosen).await.expect("prepare call");
        assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
        let unprepared = kubelet.unprepare(&chosen).await.expect("unprepare call");
        assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    }
    let cycles_seconds = started.elapsed().as_secs_f64();
    let after_cycles = memory(plugin.id());
    tokio::time::sleep(SETTLE).await;
    let after_cycles_settled = memory(plugin.id());
    plugin.kill().expect("stop the plugin");
    plugin.wait().expect("reap the plugin");
    Report {
        cycles,
        claims_per_cycle: batch,
        idle,
        after_cycles,
        after_cycles_settled,
        cycles_seconds,
    }
}

fn main() {
    let cycles: usize = std::env::var("TESSERA_BENCH_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let report = runtime.block_on(measure(cycles));
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let md = format!(
        "`tessera-kubelet-plugin` (release), mock dgx-h100, /metrics on, {} prepare/unprepare \
         cycles of {} claims (whole GPUs, MPS, time slicing) in {:.1} s.\n\n\
         | when | VmRSS | VmHWM (peak) |\n|---|---|---|\n\
         | idle (registered, pool published) | {} | {} |\n\
         | right after {} cycles | {} | {} |\n\
         | {} s later | {} | {} |\n",
        report.cycles,
        report.claims_per_cycle,
        report.cycles_seconds,
        mib(report.idle.rss_kib),
        mib(report.idle.peak_rss_kib),
        report.cycles,
        mib(report.after_cycles.rss_kib),
        mib(report.after_cycles.peak_rss_kib),
        SETTLE.as_secs(),
        mib(report.after_cycles_settled.rss_kib),
        mib(report.after_cycles_settled.peak_rss_kib),
    );
    print!("{md}");
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(
        target_tmp.join("node-plugin-rss.json"),
        serde_json::to_string_pretty(&report).expect("serializes"),
    )
    .expect("write json");
    std::fs::write(target_tmp.join("node-plugin-rss.md"), &md).expect("write markdown");
    println!("wrote {}/node-plugin-rss.{{json,md}}", target_tmp.display());
}
