//! Sockets, health streams and shutdown, observed from a simulated kubelet.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use pretty_assertions::assert_eq;
use tessera_kubelet_grpc::simulator::{HealthApiVersion, KubeletSimulator, SimulatorError};
use tessera_kubelet_grpc::{ClaimRef, DeviceHealth, HealthStatus, ServeError, SocketError};
use tokio::sync::Semaphore;

use support::{Call, RecordingDriver, ServedPlugin, config, eventually};

fn gpu_health(device: &str, status: HealthStatus, message: &str) -> DeviceHealth {
    DeviceHealth {
        pool_name: "node-a".into(),
        device_name: device.into(),
        status,
        last_updated: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        health_check_timeout: Some(Duration::from_secs(60)),
        message: message.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_updates_reach_every_stream_and_streams_end_at_shutdown() {
    let initial = vec![gpu_health("gpu-0", HealthStatus::Healthy, "")];
    let mut plugin = ServedPlugin::start(RecordingDriver::new().with_health(initial.clone()));
    assert_eq!(
        plugin.supported_services,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    let kubelet = KubeletSimulator::register(&plugin.registration_socket)
        .await
        .unwrap();
    assert_eq!(kubelet.health_version(), Some(HealthApiVersion::V1));

    let mut v1 = kubelet.watch_health().await.unwrap();
    let mut v1alpha1 = kubelet
        .watch_health_with(HealthApiVersion::V1alpha1)
        .await
        .unwrap();
    assert_eq!(v1.next().await.unwrap().unwrap(), initial);
    assert_eq!(v1alpha1.next().await.unwrap().unwrap(), initial);

    let broken = vec![gpu_health(
        "gpu-0",
        HealthStatus::Unhealthy,
        "XID 79: GPU fell off the bus",
    )];
    plugin
        .driver
        .health
        .as_ref()
        .unwrap()
        .send_replace(broken.clone());
    assert_eq!(v1.next().await.unwrap().unwrap(), broken);
    assert_eq!(v1alpha1.next().await.unwrap().unwrap(), broken);

    // Open streams must not hold up shutdown: they end, and serve returns.
    plugin.stop().await.unwrap();
    assert!(v1.next().await.is_none());
    assert!(v1alpha1.next().await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deregisters_first_finishes_in_flight_calls_and_removes_both_sockets() {
    let gate = Arc::new(Semaphore::new(0));
    let mut plugin = ServedPlugin::start(RecordingDriver::new().with_gate(Arc::clone(&gate)));
    let kubelet = KubeletSimulator::register(&plugin.registration_socket)
        .await
        .unwrap();
    let claim = ClaimRef::new("team-a", "slow", "uid-1");

    let in_flight = {
        let kubelet = kubelet.clone();
        let claim = claim.clone();
        tokio::spawn(async move { kubelet.prepare(&[claim]).await })
    };
    let driver = Arc::clone(&plugin.driver);
    eventually("the driver sees the call", || !driver.calls().is_empty()).await;

    plugin.signal_shutdown();
    let registration_socket = plugin.registration_socket.clone();
    eventually("the registration socket is gone", || {
        !registration_socket.exists()
    })
    .await;
    // Then the DRA server stops accepting, but its socket stays while a call is in flight.
    let dra_socket = plugin.dra_socket.clone();
    eventually("the DRA socket refuses connections", || {
        std::os::unix::net::UnixStream::connect(&dra_socket).is_err()
    })
    .await;
    assert!(plugin.dra_socket.exists());

    gate.add_permits(1);
    let results = in_flight.await.unwrap().unwrap();
    assert!(results[&claim.uid].is_ok(), "{results:?}");
    plugin.stop().await.unwrap();
    assert!(!plugin.dra_socket.exists());
    assert_eq!(plugin.driver.calls(), [Call::Prepare(vec![claim])]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_still_running_after_the_grace_period_are_cut_off() {
    let root = tempfile::tempdir().unwrap();
    let config = config(root.path()).shutdown_grace(Duration::from_millis(200));
    let stuck = RecordingDriver::new().with_gate(Arc::new(Semaphore::new(0)));
    let mut plugin = ServedPlugin::start_with(Some(root), config, stuck);
    let kubelet = KubeletSimulator::register(&plugin.registration_socket)
        .await
        .unwrap();
    let in_flight = tokio::spawn(async move {
        kubelet
            .prepare(&[ClaimRef::new("team-a", "stuck", "uid-1")])
            .await
    });
    let driver = Arc::clone(&plugin.driver);
    eventually("the driver sees the call", || !driver.calls().is_empty()).await;

    let error = plugin.stop().await.unwrap_err();
    assert!(matches!(error, ServeError::DrainTimedOut { .. }), "{error}");
    // The waiting call was answered UNAVAILABLE, so the kubelet retries it elsewhere.
    match in_flight.await.unwrap() {
        Err(SimulatorError::Call { status, .. }) => {
            assert_eq!(status.code(), tonic::Code::Unavailable)
        }
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    assert!(!plugin.dra_socket.exists() && !plugin.registration_socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sockets_are_replaced_and_other_files_are_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let paths = config(root.path()).socket_paths().unwrap();
    std::fs::create_dir_all(paths.dra.parent().unwrap()).unwrap();
    std::fs::create_dir_all(paths.registration.parent().unwrap()).unwrap();
    // A crashed plugin leaves socket files without listeners behind.
    drop(UnixListener::bind(&paths.dra).unwrap());
    drop(UnixListener::bind(&paths.registration).unwrap());

    let mut plugin = ServedPlugin::start_with(None, config(root.path()), RecordingDriver::new());
    let kubelet = KubeletSimulator::register(&plugin.registration_socket)
        .await
        .unwrap();
    assert!(
        kubelet
            .unprepare(&[ClaimRef::new("a", "b", "c")])
            .await
            .is_ok()
    );
    plugin.stop().await.unwrap();

    // A regular file where the registration socket goes is not ours to delete.
    std::fs::write(&paths.registration, "notes").unwrap();
    let error = config(root.path())
        .bind(Arc::new(RecordingDriver::new()))
        .unwrap_err();
    assert!(
        matches!(&error, ServeError::Socket(SocketError::NotASocket { path }) if *path == paths.registration),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(&paths.registration).unwrap(),
        "notes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_a_socket_another_process_put_in_place() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    std::fs::remove_file(&plugin.registration_socket).unwrap();
    let _successor = UnixListener::bind(&plugin.registration_socket).unwrap();
    plugin.stop().await.unwrap();
    assert!(
        plugin.registration_socket.exists(),
        "the successor's socket was removed"
    );
    assert!(!plugin.dra_socket.exists());
}

#[test]
fn sockets_and_created_directories_are_private_to_the_owner() {
    let root = tempfile::tempdir().unwrap();
    let plugin = config(root.path())
        .bind(Arc::new(RecordingDriver::new()))
        .unwrap();
    let paths = plugin.socket_paths();
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&paths.registration), 0o600);
    assert_eq!(mode(&paths.dra), 0o600);
    assert_eq!(mode(paths.dra.parent().unwrap()), 0o750);
    assert_eq!(mode(paths.registration.parent().unwrap()), 0o750);
}

#[test]
fn a_socket_path_over_the_af_unix_limit_fails_before_anything_is_created() {
    let root = tempfile::tempdir().unwrap();
    let deep = root.path().join("k".repeat(120));
    let error = config(root.path())
        .plugins_dir(&deep)
        .bind(Arc::new(RecordingDriver::new()))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ServeError::Socket(SocketError::PathTooLong { .. })),
        "{message}"
    );
    assert!(message.contains("at most 107 bytes"), "{message}");
    assert!(!deep.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rolling_update_instances_serve_side_by_side() {
    let root = tempfile::tempdir().unwrap();
    let old_config = config(root.path()).rolling_update("11111111-1111-1111-1111-111111111111");
    let new_config = config(root.path()).rolling_update("22222222-2222-2222-2222-222222222222");
    let new_paths = new_config.socket_paths().unwrap();
    let mut old = ServedPlugin::start_with(None, old_config, RecordingDriver::new());
    let mut new = ServedPlugin::start_with(None, new_config, RecordingDriver::new());
    assert_ne!(old.registration_socket, new.registration_socket);
    assert_eq!(new.registration_socket, new_paths.registration);

    for plugin in [&old, &new] {
        let kubelet = KubeletSimulator::register(&plugin.registration_socket)
            .await
            .unwrap();
        assert_eq!(kubelet.info().endpoint, plugin.dra_socket.to_str().unwrap());
        kubelet
            .unprepare(&[ClaimRef::new("a", "b", "c")])
            .await
            .unwrap();
    }
    old.stop().await.unwrap();
    assert!(new.registration_socket.exists() && new.dra_socket.exists());
    new.stop().await.unwrap();
    drop(root);
}
