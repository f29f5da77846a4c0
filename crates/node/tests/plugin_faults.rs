//! `tessera-kubelet-plugin` as a process under faults of its surroundings: a hung API server, a
//! huge batch under a low fd limit. The node must keep serving what does not depend on the
//! fault, and recover when it clears.

mod support;

use std::time::{Duration, Instant};

use tessera_fake_apiserver::{FakeApiServer, Fault, Verb};
use tessera_kubelet_grpc::ClaimRef;
use tessera_kubelet_grpc::simulator::KubeletSimulator;
use tessera_prepare_harness::{allocated_claim, uid_of};

use support::process::*;

const BACKEND: &[&str] = &["--topology", "dgx-h100"];

fn seed_claim(server: &FakeApiServer, name: &str, device: &str) -> ClaimRef {
    server.seed(&allocated_claim(name, &[("gpu", device)], vec![]));
    ClaimRef::new("ml", name, uid_of(name))
}

/// Runs `call`, failing the test if it takes longer than `limit`; returns how long it took.
async fn within<T>(limit: Duration, what: &str, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(limit, call).await {
        Ok(out) => (out, started.elapsed()),
        Err(_) => panic!("{what} took longer than {limit:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_claim_read_holds_up_nothing_else_and_fails_in_time() {
    let (server, http, _) = api_server_with_node().await;
    let held = seed_claim(&server, "held", "gpu-0");
    let other = seed_claim(&server, "other", "gpu-1");
    let slow = seed_claim(&server, "slow", "gpu-2");
    let dirs = PluginDirs::new();
    let _plugin = PluginProcess::start(
        http.kubeconfig_path(),
        &dirs,
        BACKEND,
        &[("API_TIMEOUT", "3s".into())],
    );
    let kubelet = register(&dirs).await;
    let prepared = kubelet
        .prepare(&[held.clone(), other.clone()])
        .await
        .unwrap();
    assert!(prepared.values().all(Result::is_ok), "{prepared:?}");

    // The API server hangs on one claim (far beyond the kubelet's 45 s).
    server.inject(
        Fault::on(Verb::Get, "resourceclaims")
            .named("slow")
            .delay(Duration::from_secs(400)),
    );
    let socket = dirs.registration_socket();
    let hung = tokio::spawn(async move {
        let kubelet = KubeletSimulator::register(&socket).await.unwrap();
        let started = Instant::now();
        let answer = kubelet.prepare(std::slice::from_ref(&slow)).await.unwrap();
        (answer[&slow.uid].clone(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Unrelated claims do not wait for it, and a prepared claim is answered from the
    // checkpoint without the API server.
    let (answer, took) = within(
        Duration::from_secs(2),
        "unpreparing an unrelated claim",
        kubelet.unprepare(std::slice::from_ref(&other)),
    )
    .await;
    assert!(answer.unwrap()[&other.uid].is_ok());
    println!("unrelated unprepare: {took:?}");
    server.clear_requests();
    let (answer, took) = within(
        Duration::from_secs(2),
        "preparing an already-prepared claim",
        kubelet.prepare(std::slice::from_ref(&held)),
    )
    .await;
    assert!(answer.unwrap()[&held.uid].is_ok());
    assert_eq!(server.request_count(Verb::Get, "resourceclaims"), 0);
    println!("prepare of a prepared claim: {took:?}");

    // The hung read fails the claim well inside the kubelet's 45 s, naming the timeout.
    let (answer, took) = hung.await.unwrap();
    let error = answer.unwrap_err();
    assert!(error.contains("did not answer"), "{error}");
    assert!(error.contains("ml/slow"), "{error}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Open file descriptors of process `pid` now.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5000_claim_batch_under_a_1024_fd_limit_is_prepared_with_few_connections() {
    const CLAIMS: usize = 5000;
    let (server, http, _) = api_server_with_node().await;
    let batch: Vec<ClaimRef> = (0..CLAIMS)
        .map(|i| seed_claim(&server, &format!("c{i}"), &format!("gpu-{}", i % 8)))
        .collect();
    let late = seed_claim(&server, "late", "gpu-0");
    // Every claim read takes a while, as on a busy API server: reads overlap.
    server.inject(
        Fault::on(Verb::Get, "resourceclaims")
            .delay(Duration::from_millis(50))
            .times(usize::MAX),
    );
    let shm = std::path::Path::new("/dev/shm");
    let dirs = if shm.is_dir() {
        PluginDirs::under(shm)
    } else {
        PluginDirs::new()
    };
    let plugin = PluginProcess::start_in_shell(
        http.kubeconfig_path(),
        &dirs,
        BACKEND,
        // Room for 5,000 reads of 50 ms, 32 at a time, in one call.
        &[("API_TIMEOUT", "30s".into())],
        "ulimit -n 1024;",
    );
    let kubelet = register(&dirs).await;
    let pid = plugin.pid();
    let baseline = open_fds(pid);

    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = std::sync::Arc::clone(&sampling);
        std::thread::spawn(move || {
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(open_fds(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        })
    };
    let started = Instant::now();
    let answers = kubelet.prepare(&batch).await.unwrap();
    let took = started.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let most_fds = sampler.join().unwrap();

    let failed: Vec<&String> = answers.values().filter_map(|a| a.as_ref().err()).collect();
    println!(
        "{CLAIMS} claims in {took:?}: {} failed; open fds {baseline} before, at most {most_fds} during",
        failed.len()
    );
    assert_eq!(answers.len(), CLAIMS);
    assert!(
        failed.is_empty(),
        "{} of {CLAIMS} claims failed, e.g. {:?}\n{}",
        failed.len(),
        failed.first(),
        plugin_logs(&dirs)
    );
    assert!(
        most_fds < baseline + 100,
        "the plugin held up to {most_fds} fds (baseline {baseline}): reads are not bounded"
    );
    // Later prepares work at once.
    let answer = kubelet.prepare(std::slice::from_ref(&late)).await.unwrap();
    assert!(answer[&late.uid].is_ok(), "{answer:?}");
}

/// Starts the plugin and waits until it registered with the kubelet; fails the test at once if
/// it exits instead (a crash loop in the making).
async fn start_and_register(
    http: &tessera_fake_apiserver::HttpServer,
    dirs: &PluginDirs,
    env: &[(&str, String)],
    setup: &str,
) -> (PluginProcess, KubeletSimulator) {
    let plugin = PluginProcess::start_in_shell(http.kubeconfig_path(), dirs, BACKEND, env, setup);
    let socket = dirs.registration_socket();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let exited = plugin
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_wait()
            .unwrap();
        if let Some(status) = exited {
            panic!(
                "the plugin exited at start ({status}): a crash loop\n{}",
                plugin_logs(dirs)
            );
        }
        if socket.exists()
            && let Ok(kubelet) = KubeletSimulator::register(&socket).await
        {
            return (plugin, kubelet);
        }
        assert!(
            Instant::now() < deadline,
            "the plugin did not register\n{}",
            plugin_logs(dirs)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The CDI spec files in the plugin's CDI directory.
fn spec_files(dirs: &PluginDirs) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dirs.path("cdi"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_does_not_stop_the_start() {
    let (server, http, _) = api_server_with_node().await;
    let claim = seed_claim(&server, "held", "gpu-0");
    let dirs = PluginDirs::new();
    let (plugin, kubelet) = start_and_register(&http, &dirs, &[], "").await;
    let first = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let devices = first[&claim.uid].clone().unwrap();
    plugin.kill();

    // No file may grow any more (as on a full disk); SIGXFSZ is ignored, so writes fail.
    let (plugin, kubelet) =
        start_and_register(&http, &dirs, &[], "trap '' XFSZ; ulimit -f 0;").await;
    let again = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(again[&claim.uid], Ok(devices));
    let ready = eventually(&dirs, "readiness", Duration::from_secs(30), async || {
        let (code, body) = plugin.http_get("/readyz").await?;
        (code == 200).then_some(body)
    })
    .await;
    assert!(ready.contains("ok") || !ready.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_checkpoint_while_list_fails_serves_unprepare_and_recovers() {
    for (what, damage) in [("corrupt", Some(&b"not json"[..])), ("missing", None)] {
        let (server, http, _) = api_server_with_node().await;
        let kept = seed_claim(&server, "kept", "gpu-0");
        let dropped = seed_claim(&server, "dropped", "gpu-1");
        let dirs = PluginDirs::new();
        let (plugin, kubelet) = start_and_register(&http, &dirs, &[], "").await;
        let first = kubelet
            .prepare(&[kept.clone(), dropped.clone()])
            .await
            .unwrap();
        assert!(first.values().all(Result::is_ok), "{first:?}");
        let devices = first[&kept.uid].clone().unwrap();
        plugin.kill();
        let checkpoint = dirs.path("state").join("checkpoint.json");
        match damage {
            Some(bytes) => std::fs::write(&checkpoint, bytes).unwrap(),
            None => std::fs::remove_file(&checkpoint).unwrap(),
        }
        server.inject(
            Fault::on(Verb::List, "resourceclaims")
                .status(500)
                .times(usize::MAX),
        );

        let (plugin, kubelet) = start_and_register(&http, &dirs, &[], "").await;
        let (code, body) = eventually(&dirs, "/readyz", Duration::from_secs(30), async || {
            plugin.http_get("/readyz").await
        })
        .await;
        assert_eq!(code, 503, "{what}: {body}");
        assert!(body.contains("still recovering"), "{what}: {body}");
        // What can be served is served: the kubelet's unprepare of a claim known by its spec.
        let answer = kubelet
            .unprepare(std::slice::from_ref(&dropped))
            .await
            .unwrap();
        assert!(answer[&dropped.uid].is_ok(), "{what}: {answer:?}");
        assert_eq!(
            spec_files(&dirs).len(),
            1,
            "{what}: the unprepared claim's spec goes"
        );
        // New prepares wait for recovery, saying why.
        let answer = kubelet.prepare(std::slice::from_ref(&kept)).await.unwrap();
        let error = answer[&kept.uid].clone().unwrap_err();
        assert!(error.contains("still recovering"), "{what}: {error}");

        // The API server answers again: recovery finishes, the claim is rebuilt.
        server.clear_faults();
        eventually(
            &dirs,
            "readiness after the fault",
            Duration::from_secs(60),
            async || {
                let (code, _) = plugin.http_get("/readyz").await?;
                (code == 200).then_some(())
            },
        )
        .await;
        let answer = kubelet.prepare(std::slice::from_ref(&kept)).await.unwrap();
        assert_eq!(answer[&kept.uid], Ok(devices), "{what}");
        drop(plugin);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_config_value_is_not_echoed_whole() {
    let (server, http, _) = api_server_with_node().await;
    let huge = "x".repeat(5 << 20);
    server.seed(&allocated_claim(
        "huge",
        &[("gpu", "gpu-0")],
        vec![tessera_prepare_harness::claim_config(
            &[],
            "GpuConfig",
            serde_json::json!({"strategy": huge}),
        )],
    ));
    let claim = ClaimRef::new("ml", "huge", uid_of("huge"));
    let dirs = PluginDirs::new();
    let (plugin, kubelet) = start_and_register(&http, &dirs, &[], "").await;
    let answer = kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .expect("the reply fits the kubelet's 4 MiB limit");
    let error = answer[&claim.uid].clone().unwrap_err();
    assert!(
        error.len() <= tessera_kubelet_grpc::MAX_CLAIM_ERROR_BYTES,
        "{} bytes",
        error.len()
    );
    assert!(
        error.contains("ml/huge") && error.contains("bytes cut"),
        "{error}"
    );
    let log = std::fs::read(dirs.path(&format!("plugin-{}.log", plugin.metrics_port))).unwrap();
    assert!(log.len() < 100_000, "the log holds {} bytes", log.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_directories_and_sockets_get_their_modes_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| {
        std::fs::symlink_metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    for umask in ["000", "077"] {
        let (server, http, _) = api_server_with_node().await;
        let mps = tessera_prepare_harness::claim_config(
            &[],
            "GpuConfig",
            serde_json::json!({"strategy": "MPS"}),
        );
        server.seed(&allocated_claim("shared", &[("gpu", "gpu-0")], vec![mps]));
        let claim = ClaimRef::new("ml", "shared", uid_of("shared"));
        let dirs = PluginDirs::new();
        let (plugin, kubelet) =
            start_and_register(&http, &dirs, &[], &format!("umask {umask};")).await;
        let answer = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        assert!(answer[&claim.uid].is_ok(), "{answer:?}");

        let state = dirs.path("state");
        let claim_mps = state.join("mps").join(claim.uid.as_str());
        let spec = dirs
            .path("cdi")
            .join(format!("gpu.tessera.dev-claim_{}.json", claim.uid));
        let dra = dirs.path("plugins").join("gpu.tessera.dev");
        let expected = [
            (state.clone(), 0o700),
            (state.join("checkpoint.json"), 0o600),
            (state.join("mps"), 0o700),
            (claim_mps.clone(), 0o755),
            (claim_mps.join("pipe"), 0o755),
            (claim_mps.join("log"), 0o755),
            (dirs.path("cdi"), 0o755),
            (spec, 0o644),
            (dra.clone(), 0o750),
            (dra.join("dra.sock"), 0o600),
            (dirs.path("reg"), 0o750),
            (dirs.registration_socket(), 0o600),
        ];
        for (path, want) in expected {
            assert_eq!(
                format!("{:o}", mode(&path)),
                format!("{want:o}"),
                "umask {umask}: {}",
                path.display()
            );
        }
        drop(plugin);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_copied_from_another_node_is_quarantined_not_used() {
    use tessera_gpu_inventory::{DeviceSource, MockSource};
    use tessera_prepare::checkpoint::{self, ClaimRecord, ClaimState, DeviceRecord, DeviceTarget};

    let (_server, http, _) = api_server_with_node().await;
    // Node B's checkpoint, in today's format and in the version 1 format (no node recorded).
    let node_b = MockSource::new("dgx-h100")
        .unwrap()
        .for_node("node-b")
        .inventory()
        .unwrap();
    let uid = uid_of("stolen");
    let record = ClaimRecord {
        namespace: "ml".into(),
        name: "stolen".into(),
        state: ClaimState::PrepareCompleted,
        devices: vec![DeviceRecord {
            request: "gpu".into(),
            pool: "node-b".into(),
            device: "gpu-0".into(),
            cdi_device_ids: vec![format!("gpu.tessera.dev/claim={uid}-gpu-0")],
            target: DeviceTarget::Gpu {
                uuid: node_b.gpus[0].uuid.clone(),
                minor: 0,
            },
            sharing: None,
            share: None,
        }],
        mps: None,
        imex: None,
    };
    let of_node_b = checkpoint::Checkpoint {
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim()
            .to_owned(),
        node_name: "node-b".into(),
        pool_name: "node-b".into(),
        claims: [(uid.clone().into(), record)].into(),
    };
    let v1 = String::from_utf8(checkpoint::encode(&checkpoint::Checkpoint {
        node_name: String::new(),
        pool_name: String::new(),
        ..of_node_b.clone()
    }))
    .unwrap()
    .replace("\"version\": 2", "\"version\": 1");
    for (what, bytes) in [
        ("version 1", v1.into_bytes()),
        ("version 2", checkpoint::encode(&of_node_b)),
    ] {
        let dirs = PluginDirs::new();
        std::fs::create_dir_all(dirs.path("state")).unwrap();
        std::fs::write(dirs.path("state").join("checkpoint.json"), &bytes).unwrap();
        let (plugin, _kubelet) = start_and_register(&http, &dirs, &[], "").await;
        assert_eq!(
            spec_files(&dirs),
            Vec::<String>::new(),
            "{what}: node B's GPUs went into a CDI spec\n{}",
            plugin_logs(&dirs)
        );
        let quarantined = tessera_prepare::checkpoint::quarantined_files(&dirs.path("state"));
        assert_eq!(quarantined.len(), 1, "{what}: {quarantined:?}");
        assert!(
            quarantined[0]
                .to_string_lossy()
                .contains("checkpoint.json.foreign-"),
            "{what}: {quarantined:?}"
        );
        assert_eq!(std::fs::read(&quarantined[0]).unwrap(), bytes, "{what}");
        let logs = plugin_logs(&dirs);
        assert!(logs.contains("copied from another node"), "{what}\n{logs}");
        drop(plugin);
    }
}
