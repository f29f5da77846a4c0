//! A simulated kubelet registers the plugin and sends prepare/unprepare batches over real
//! unix sockets, through both DRA versions, including malformed requests.

mod support;

use std::time::Duration;

use pretty_assertions::assert_eq;
use tessera_kubelet_grpc::proto::dra_v1;
use tessera_kubelet_grpc::simulator::{self, DraApiVersion, KubeletSimulator, SimulatorError};
use tessera_kubelet_grpc::{ClaimRef, ClaimUid, PreparedDevice, RegistrationState};
use tonic::Code;

use support::{Call, DRIVER, RecordingDriver, ServedPlugin, cdi_id};

fn claim(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("team-a", name, uid)
}

async fn registered(plugin: &ServedPlugin) -> KubeletSimulator {
    let kubelet = KubeletSimulator::register(&plugin.registration_socket)
        .await
        .unwrap();
    let mut state = plugin.registration_state.clone();
    tokio::time::timeout(
        Duration::from_secs(5),
        state.wait_for(RegistrationState::is_registered),
    )
    .await
    .expect("registration status never arrived")
    .unwrap();
    kubelet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_advertises_v1_first_and_records_the_verdict() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    assert_eq!(
        *plugin.registration_state.borrow(),
        RegistrationState::Pending
    );

    let info = simulator::get_info(&plugin.registration_socket)
        .await
        .unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, plugin.dra_socket.to_str().unwrap());
    assert!(plugin.dra_socket.is_absolute());
    // Without a health watch the plugin offers no health service.
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    simulator::notify_registration_status(&plugin.registration_socket, false, "driver name taken")
        .await
        .unwrap();
    assert_eq!(
        *plugin.registration_state.borrow(),
        RegistrationState::Rejected {
            error: "driver name taken".into()
        }
    );

    let kubelet = registered(&plugin).await;
    assert_eq!(kubelet.dra_version(), DraApiVersion::V1);
    assert_eq!(kubelet.health_version(), None);
    plugin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_go_through_v1_and_v1beta1_with_per_claim_errors() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;
    let good = claim("good", "uid-1");
    let bad = claim("fail-missing-device", "uid-2");
    let batch = [good.clone(), bad.clone()];

    let v1 = kubelet
        .prepare_with(DraApiVersion::V1, &batch)
        .await
        .unwrap();
    let expected_device = PreparedDevice {
        // The driver said "gpu/large"; the kubelet gets the request name without subrequest.
        request_names: vec!["gpu".into()],
        pool_name: "node-a".into(),
        device_name: "gpu-0".into(),
        cdi_device_ids: vec![cdi_id(&good)],
        share_id: Some("share-1".into()),
    };
    assert_eq!(v1[&good.uid], Ok(vec![expected_device.clone()]));
    let error = v1[&bad.uid].as_ref().unwrap_err();
    assert!(
        error.contains("team-a/fail-missing-device (uid-2)") && error.contains("gpu-9"),
        "{error}"
    );

    let v1beta1 = kubelet
        .prepare_with(DraApiVersion::V1beta1, &batch)
        .await
        .unwrap();
    // v1beta1 has no share id field.
    let v1beta1_device = PreparedDevice {
        share_id: None,
        ..expected_device
    };
    assert_eq!(v1beta1[&good.uid], Ok(vec![v1beta1_device]));
    assert!(v1beta1[&bad.uid].is_err());

    let unprepared = kubelet
        .unprepare_with(DraApiVersion::V1, &batch)
        .await
        .unwrap();
    assert_eq!(unprepared[&good.uid], Ok(()));
    assert!(
        unprepared[&bad.uid]
            .as_ref()
            .unwrap_err()
            .contains("CDI spec")
    );
    let unprepared = kubelet
        .unprepare_with(DraApiVersion::V1beta1, std::slice::from_ref(&good))
        .await
        .unwrap();
    assert_eq!(unprepared.len(), 1);

    assert_eq!(
        plugin.driver.calls(),
        [
            Call::Prepare(batch.to_vec()),
            Call::Prepare(batch.to_vec()),
            Call::Unprepare(batch.to_vec()),
            Call::Unprepare(vec![good]),
        ]
    );
    plugin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_batches_get_a_status_or_per_claim_errors_and_never_reach_the_driver() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;

    // An empty UID leaves nothing to key the answer by: the whole call fails.
    let error = kubelet
        .prepare(&[claim("good", "uid-1"), claim("no-uid", "")])
        .await
        .unwrap_err();
    let SimulatorError::Call { status, .. } = error else {
        panic!("expected a gRPC status, got {error}");
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("team-a/no-uid"),
        "{}",
        status.message()
    );

    // Missing namespace and conflicting duplicates fail only those claims; an exact repeat is
    // passed on once.
    let batch = [
        claim("good", "uid-1"),
        claim("good", "uid-1"),
        ClaimRef::new("", "orphan", "uid-2"),
        claim("one", "uid-3"),
        claim("other", "uid-3"),
    ];
    let results = kubelet.prepare(&batch).await.unwrap();
    assert_eq!(
        results.keys().map(ClaimUid::as_str).collect::<Vec<_>>(),
        ["uid-1", "uid-2", "uid-3"]
    );
    assert!(results[&ClaimUid::from("uid-1")].is_ok());
    assert!(
        results[&ClaimUid::from("uid-2")]
            .as_ref()
            .unwrap_err()
            .contains("namespace is empty")
    );
    assert!(
        results[&ClaimUid::from("uid-3")]
            .as_ref()
            .unwrap_err()
            .contains("appears twice")
    );

    // An empty batch is answered without calling the driver.
    assert!(kubelet.unprepare(&[]).await.unwrap().is_empty());

    assert_eq!(
        plugin.driver.calls(),
        [Call::Prepare(vec![claim("good", "uid-1")])]
    );
    plugin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_the_driver_forgets_get_an_error_entry() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;
    let forgotten = claim("forget-me", "uid-9");
    let results = kubelet
        .prepare(&[forgotten.clone(), claim("good", "uid-1")])
        .await
        .unwrap();
    let error = results[&forgotten.uid].as_ref().unwrap_err();
    assert!(
        error.contains("returned no result") && error.contains("team-a/forget-me"),
        "{error}"
    );
    assert!(results[&ClaimUid::from("uid-1")].is_ok());
    plugin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_panic_is_an_internal_status_and_the_plugin_keeps_serving() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;
    let error = kubelet
        .prepare(&[claim("panic", "uid-1")])
        .await
        .unwrap_err();
    let SimulatorError::Call { status, .. } = error else {
        panic!("expected a gRPC status, got {error}");
    };
    assert_eq!(status.code(), Code::Internal);
    // The serialization lock was released by the panicking call.
    let results = kubelet.prepare(&[claim("good", "uid-2")]).await.unwrap();
    assert!(results[&ClaimUid::from("uid-2")].is_ok());
    plugin.stop().await.unwrap();
}

/// A message shaped like nothing the DRA service accepts: field 1 (`claims`) as a number.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWireType {
    #[prost(uint64, tag = "1")]
    claims: u64,
}

/// A claim whose `uid` (field 2) is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct NotUtf8Claim {
    #[prost(bytes = "vec", tag = "2")]
    uid: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct NotUtf8Request {
    #[prost(message, repeated, tag = "1")]
    claims: Vec<NotUtf8Claim>,
}

async fn send_undecodable<M: prost::Message + Send + 'static>(
    kubelet: &KubeletSimulator,
    message: M,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(kubelet.dra_channel());
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<M, dra_v1::NodePrepareResourcesResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    );
    grpc.unary(tonic::Request::new(message), path, codec)
        .await
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_messages_get_an_error_status_not_a_crash() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;

    let status = send_undecodable(&kubelet, WrongWireType { claims: 7 }).await;
    assert_eq!(status.code(), Code::Internal, "{status}");
    let not_utf8 = NotUtf8Request {
        claims: vec![NotUtf8Claim {
            uid: vec![0xff, 0xfe],
        }],
    };
    let status = send_undecodable(&kubelet, not_utf8).await;
    assert_eq!(status.code(), Code::Internal, "{status}");

    assert!(plugin.driver.calls().is_empty());
    let results = kubelet.prepare(&[claim("good", "uid-1")]).await.unwrap();
    assert!(results[&ClaimUid::from("uid-1")].is_ok());
    plugin.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_name_is_refused_and_the_reply_stays_small() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let kubelet = registered(&plugin).await;
    // Just under the kubelet's 4 MiB message limit; the driver would echo it in its error.
    let name = format!("fail-{}", "n".repeat((4 << 20) - 4096));
    let results = kubelet
        .prepare(&[claim(&name, "uid-1"), claim("good", "uid-2")])
        .await
        .expect("the reply fits the kubelet's 4 MiB limit");
    let error = results[&ClaimUid::from("uid-1")].as_ref().unwrap_err();
    assert!(
        error.contains("not a DNS-1123 subdomain"),
        "{}",
        &error[..200]
    );
    assert!(
        error.len() <= tessera_kubelet_grpc::MAX_CLAIM_ERROR_BYTES,
        "{}",
        error.len()
    );
    assert!(results[&ClaimUid::from("uid-2")].is_ok());
    assert_eq!(
        plugin.driver.calls(),
        [Call::Prepare(vec![claim("good", "uid-2")])]
    );
    plugin.stop().await.unwrap();
}
