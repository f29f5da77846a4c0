//! The kubelet's registration call as it is on the wire: grpc-go dials the registration socket
//! by path and sends that path as `:authority` (Kubernetes 1.37, pluginmanager's `dial`). The
//! simulator cannot send that (the `http` crate refuses such an authority), so this test writes
//! the HTTP/2 frames itself and checks that GetInfo is answered rather than reset.

mod support;

use std::time::Duration;

use prost::Message;
use tessera_kubelet_grpc::proto::registration::{InfoRequest, PluginInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use support::{RecordingDriver, ServedPlugin};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = payload.len();
    let mut out = vec![
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        kind,
        flags,
    ];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn read_frame(stream: &mut UnixStream) -> (u8, u8, u32, Vec<u8>) {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.unwrap();
    let length =
        usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.unwrap();
    let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    (header[3], header[4], id, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_info_with_the_socket_path_as_authority_is_answered() {
    let mut plugin = ServedPlugin::start(RecordingDriver::new());
    let path = plugin.registration_socket.clone();
    let authority = path.to_str().unwrap().as_bytes().to_vec();
    let mut stream = UnixStream::connect(&path).await.unwrap();

    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", &authority),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.82.1"),
        (b"te", b"trailers"),
    ];
    let block = loona_hpack::Encoder::new().encode(headers);
    let message = InfoRequest {}.encode_to_vec();
    let mut grpc = vec![0u8];
    grpc.extend_from_slice(&(message.len() as u32).to_be_bytes());
    grpc.extend_from_slice(&message);

    let mut request = PREFACE.to_vec();
    request.extend(frame(SETTINGS, 0, 0, &[]));
    request.extend(frame(HEADERS, 0x4, 1, &block)); // END_HEADERS
    request.extend(frame(DATA, 0x1, 1, &grpc)); // END_STREAM
    stream.write_all(&request).await.unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let mut status = None;
    let mut info = None;
    let answer = async {
        loop {
            let (kind, flags, id, payload) = read_frame(&mut stream).await;
            match kind {
                SETTINGS if flags & 0x1 == 0 => {
                    stream
                        .write_all(&frame(SETTINGS, 0x1, 0, &[]))
                        .await
                        .unwrap();
                }
                HEADERS if id == 1 => {
                    for (name, value) in decoder.decode(&payload).unwrap() {
                        if name == b"grpc-status" {
                            status = Some(String::from_utf8(value).unwrap());
                        }
                    }
                    if flags & 0x1 != 0 {
                        break; // trailers end the stream
                    }
                }
                DATA if id == 1 && payload.len() > 5 => {
                    info = Some(PluginInfo::decode(&payload[5..]).unwrap());
                }
                RST_STREAM | GOAWAY => panic!(
                    "the server refused the kubelet's request: frame type {kind} payload {payload:?}"
                ),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("no answer within 10 s");
    assert_eq!(status.as_deref(), Some("0"));
    let info = info.expect("no PluginInfo in the answer");
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, support::DRIVER);
    // Like the kubelet, close the connection once registered (shutdown waits for open ones).
    drop(stream);
    plugin.stop().await.unwrap();
}
