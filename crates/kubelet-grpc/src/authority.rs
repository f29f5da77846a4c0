//! Accepting the kubelet's registration calls, whose `:authority` is a socket path.
//!
//! The kubelet dials a plugin's *registration* socket with grpc-go's passthrough resolver and no
//! authority override (`dial` in `pkg/kubelet/pluginmanager/operationexecutor` of Kubernetes
//! 1.37), so every request carries `:authority` = the socket path, e.g.
//! `/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock`. A path is not a URI authority:
//! h2, under tonic, answers such a request with `RST_STREAM(PROTOCOL_ERROR)`, and the kubelet
//! never registers the plugin. (The DRA socket is dialled as `unix:<path>`, whose authority is
//! `localhost`; only registration is affected.)
//!
//! [`LenientAuthority`] wraps an accepted connection and rewrites the client's HTTP/2 header
//! blocks before h2 sees them: each block is HPACK-decoded (with the client's dynamic table) and
//! re-encoded with literals that never touch the server's dynamic table, an `:authority` that is
//! not a valid URI authority becoming `localhost`. Every other frame, and everything the server
//! sends, passes through unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may announce; rewritten blocks are split to fit.
const MAX_FRAME_PAYLOAD: usize = 16_384;
/// The largest frame accepted from the client (h2's default limit).
const MAX_INCOMING_FRAME: usize = 16_777_215;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// What replaces an `:authority` that is not a URI authority.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a client's bytes could not be rewritten (the connection is then closed).
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("the client did not send the HTTP/2 connection preface")]
    Preface,
    #[error("HTTP/2 frame of {0} bytes exceeds the limit")]
    FrameTooLarge(usize),
    #[error("HTTP/2 HEADERS frame on stream {0} is malformed (padding or priority)")]
    MalformedHeaders(u32),
    #[error("CONTINUATION frame on stream {0} without a HEADERS frame before it")]
    UnexpectedContinuation(u32),
    #[error(
        "frame of type {frame_type} on stream {stream} inside the header block of stream {open}"
    )]
    InterleavedHeaderBlock {
        frame_type: u8,
        stream: u32,
        open: u32,
    },
    #[error("cannot decode the header block of stream {stream}: {reason}")]
    Hpack { stream: u32, reason: String },
}

/// A header block being collected (HEADERS without END_HEADERS, then CONTINUATIONs).
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server half of the rewrite: bytes in, rewritten bytes out. No IO.
pub struct HeaderBlockRewriter {
    preface_left: usize,
    pending: Vec<u8>,
    decoder: loona_hpack::Decoder<'static>,
    open: Option<OpenBlock>,
    rewritten: u64,
}

impl Default for HeaderBlockRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderBlockRewriter {
    pub fn new() -> Self {
        Self {
            preface_left: PREFACE.len(),
            pending: Vec::new(),
            decoder: loona_hpack::Decoder::new(),
            open: None,
            rewritten: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Consumes `input` (any split of the client's byte stream) and appends what the server
    /// should read to `out`. Incomplete frames are kept until the rest arrives.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut input = input;
        if self.preface_left > 0 {
            let take = self.preface_left.min(input.len());
            let offset = PREFACE.len() - self.preface_left;
            if input[..take] != PREFACE[offset..offset + take] {
                return Err(RewriteError::Preface);
            }
            out.extend_from_slice(&input[..take]);
            self.preface_left -= take;
            input = &input[take..];
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(input);
        let mut consumed = 0;
        while let Some(frame) = Frame::parse(&pending[consumed..])? {
            let length = frame.wire_length();
            self.frame(frame, out)?;
            consumed += length;
        }
        pending.drain(..consumed);
        self.pending = pending;
        Ok(())
    }

    fn frame(&mut self, frame: Frame<'_>, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if let Some(open) = &self.open
            && (frame.kind != CONTINUATION || frame.stream != open.stream)
        {
            return Err(RewriteError::InterleavedHeaderBlock {
                frame_type: frame.kind,
                stream: frame.stream,
                open: open.stream,
            });
        }
        match frame.kind {
            HEADERS => {
                let (priority, fragment) = frame.headers_payload()?;
                let block = OpenBlock {
                    stream: frame.stream,
                    end_stream: frame.flags & END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                };
                if frame.flags & END_HEADERS != 0 {
                    self.finish(block, out)
                } else {
                    self.open = Some(block);
                    Ok(())
                }
            }
            CONTINUATION => {
                let mut block = self
                    .open
                    .take()
                    .ok_or(RewriteError::UnexpectedContinuation(frame.stream))?;
                block.fragment.extend_from_slice(frame.payload);
                if frame.flags & END_HEADERS != 0 {
                    self.finish(block, out)
                } else {
                    self.open = Some(block);
                    Ok(())
                }
            }
            _ => {
                out.extend_from_slice(frame.bytes);
                Ok(())
            }
        }
    }

    /// Decodes a complete header block, rewrites it and emits HEADERS (+ CONTINUATION) frames.
    fn finish(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let fields = self
            .decoder
            .decode(&block.fragment)
            .map_err(|error| RewriteError::Hpack {
                stream: block.stream,
                reason: format!("{error:?}"),
            })?;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 16);
        for (name, value) in &fields {
            let value = if name == b":authority" && !is_uri_authority(value) {
                self.rewritten += 1;
                REPLACEMENT_AUTHORITY
            } else {
                value.as_slice()
            };
            encode_literal_without_indexing(name, value, &mut encoded);
        }
        let mut payload = Vec::with_capacity(encoded.len() + 5);
        if let Some(priority) = block.priority {
            payload.extend_from_slice(&priority);
        }
        payload.extend_from_slice(&encoded);
        // At least one HEADERS frame, then CONTINUATIONs, each within the minimum frame size.
        let chunks: Vec<&[u8]> = if payload.is_empty() {
            vec![&[]]
        } else {
            payload.chunks(MAX_FRAME_PAYLOAD).collect()
        };
        for (index, chunk) in chunks.iter().enumerate() {
            let (kind, mut flags) = if index == 0 {
                let mut flags = 0;
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= PRIORITY;
                }
                (HEADERS, flags)
            } else {
                (CONTINUATION, 0)
            };
            if index + 1 == chunks.len() {
                flags |= END_HEADERS;
            }
            write_frame_header(chunk.len(), kind, flags, block.stream, out);
            out.extend_from_slice(chunk);
        }
        Ok(())
    }
}

/// One complete frame within a buffer.
struct Frame<'a> {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &'a [u8],
    /// Header and payload, as received.
    bytes: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The first complete frame of `buffer`, if it holds one.
    fn parse(buffer: &'a [u8]) -> Result<Option<Self>, RewriteError> {
        if buffer.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let length =
            usize::from(buffer[0]) << 16 | usize::from(buffer[1]) << 8 | usize::from(buffer[2]);
        if length > MAX_INCOMING_FRAME {
            return Err(RewriteError::FrameTooLarge(length));
        }
        if buffer.len() < FRAME_HEADER_LEN + length {
            return Ok(None);
        }
        let stream = u32::from_be_bytes([buffer[5], buffer[6], buffer[7], buffer[8]]) & 0x7fff_ffff;
        Ok(Some(Self {
            kind: buffer[3],
            flags: buffer[4],
            stream,
            payload: &buffer[FRAME_HEADER_LEN..FRAME_HEADER_LEN + length],
            bytes: &buffer[..FRAME_HEADER_LEN + length],
        }))
    }

    fn wire_length(&self) -> usize {
        self.bytes.len()
    }

    /// A HEADERS frame's priority fields and header block fragment (padding removed).
    fn headers_payload(&self) -> Result<(Option<[u8; 5]>, &'a [u8]), RewriteError> {
        let malformed = || RewriteError::MalformedHeaders(self.stream);
        let mut payload = self.payload;
        if self.flags & PADDED != 0 {
            let (&pad, rest) = payload.split_first().ok_or_else(malformed)?;
            let keep = rest
                .len()
                .checked_sub(usize::from(pad))
                .ok_or_else(malformed)?;
            payload = &rest[..keep];
        }
        let priority = if self.flags & PRIORITY != 0 {
            let (fields, rest) = payload.split_first_chunk::<5>().ok_or_else(malformed)?;
            payload = rest;
            Some(*fields)
        } else {
            None
        };
        Ok((priority, payload))
    }
}

fn write_frame_header(length: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    // `length` is at most MAX_FRAME_PAYLOAD, which fits 24 bits.
    out.extend_from_slice(&[
        (length >> 16) as u8,
        (length >> 8) as u8,
        length as u8,
        kind,
        flags,
    ]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// HPACK integer with an `prefix_bits`-bit prefix (RFC 7541 §5.1); `first` holds the pattern bits.
fn encode_integer(value: usize, prefix_bits: u8, first: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// "Literal Header Field without Indexing — New Name" (RFC 7541 §6.2.2), no Huffman coding.
fn encode_literal_without_indexing(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_integer(name.len(), 7, 0x00, out);
    out.extend_from_slice(name);
    encode_integer(value.len(), 7, 0x00, out);
    out.extend_from_slice(value);
}

/// Whether h2 would accept `value` as `:authority`.
fn is_uri_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// An accepted connection whose client header blocks pass through [`HeaderBlockRewriter`].
pub struct LenientAuthority<S> {
    io: S,
    rewriter: HeaderBlockRewriter,
    /// Rewritten bytes not yet handed to the reader.
    ready: Vec<u8>,
    ready_from: usize,
}

impl<S> LenientAuthority<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            rewriter: HeaderBlockRewriter::new(),
            ready: Vec::new(),
            ready_from: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LenientAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_from < this.ready.len() {
                let available = &this.ready[this.ready_from..];
                let take = available.len().min(buf.remaining());
                buf.put_slice(&available[..take]);
                this.ready_from += take;
                if this.ready_from == this.ready.len() {
                    this.ready.clear();
                    this.ready_from = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut raw = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut raw))?;
            if raw.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.rewriter
                .push(raw.filled(), &mut this.ready)
                .map_err(|error| {
                    tracing::warn!(%error, "closing a registration connection whose HTTP/2 headers cannot be rewritten");
                    io::Error::new(io::ErrorKind::InvalidData, error)
                })?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LenientAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for LenientAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    const SOCKET_PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/gpu.tessera.dev-reg.sock";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame_header(payload.len(), kind, flags, stream, &mut out);
        out.extend_from_slice(payload);
        out
    }

    fn request_headers(authority: &[u8]) -> Fields {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (
                b":path".to_vec(),
                b"/pluginregistration.Registration/GetInfo".to_vec(),
            ),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn encode(encoder: &mut loona_hpack::Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;
    /// kind, flags, stream, decoded header fields (HEADERS only), payload.
    type SeenFrame = (u8, u8, u32, Fields, Vec<u8>);

    /// Splits rewritten output into frames, decoding header blocks with a server-side decoder.
    fn server_view(bytes: &[u8]) -> Vec<SeenFrame> {
        assert!(bytes.starts_with(PREFACE));
        let mut rest = &bytes[PREFACE.len()..];
        let mut decoder = loona_hpack::Decoder::new();
        let mut frames = Vec::new();
        while let Some(frame) = Frame::parse(rest).unwrap() {
            let headers = if frame.kind == HEADERS {
                let (_, block) = frame.headers_payload().unwrap();
                decoder.decode(block).unwrap()
            } else {
                Vec::new()
            };
            frames.push((
                frame.kind,
                frame.flags,
                frame.stream,
                headers,
                frame.payload.to_vec(),
            ));
            rest = &rest[frame.wire_length()..];
        }
        assert!(rest.is_empty(), "trailing bytes");
        frames
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut client = PREFACE.to_vec();
        client.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        client.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut encoder, &request_headers(SOCKET_PATH)),
        ));
        client.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0])); // DATA
        // A second request reuses the client's dynamic table (indexed fields).
        client.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &encode(&mut encoder, &request_headers(SOCKET_PATH)),
        ));

        let mut rewriter = HeaderBlockRewriter::new();
        let mut out = Vec::new();
        // Byte by byte: frames split anywhere must come out the same.
        for byte in &client {
            rewriter.push(std::slice::from_ref(byte), &mut out).unwrap();
        }
        assert_eq!(rewriter.rewritten(), 2);
        let frames = server_view(&out);
        assert_eq!(frames.len(), 4);
        assert_eq!((frames[0].0, frames[0].4.len()), (0x4, 0));
        for index in [1, 3] {
            let (kind, flags, _, headers, _) = &frames[index];
            assert_eq!((*kind, *flags), (HEADERS, END_HEADERS));
            assert_eq!(headers, &request_headers(b"localhost"));
        }
        assert_eq!(frames[2].4, [0, 0, 0, 0, 0]);
    }

    #[test]
    fn valid_authorities_and_flags_pass_unchanged() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request_headers(b"localhost"));
        // PADDED + PRIORITY + END_STREAM, and the block split over a CONTINUATION.
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        payload.extend_from_slice(&block[..4]);
        payload.extend_from_slice(&[0, 0, 0]); // padding
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &payload));
        client.extend(frame(CONTINUATION, END_HEADERS, 5, &block[4..]));
        let mut rewriter = HeaderBlockRewriter::new();
        let mut out = Vec::new();
        rewriter.push(&client, &mut out).unwrap();
        assert_eq!(rewriter.rewritten(), 0);
        let frames = server_view(&out);
        assert_eq!(frames.len(), 1);
        let (kind, flags, stream, headers, payload) = &frames[0];
        assert_eq!(
            (*kind, *flags, *stream),
            (HEADERS, PRIORITY | END_STREAM | END_HEADERS, 5)
        );
        assert_eq!(&payload[..5], &[0, 0, 0, 0, 16]);
        assert_eq!(headers, &request_headers(b"localhost"));
    }

    #[test]
    fn large_blocks_are_split_into_continuations() {
        let mut headers = request_headers(SOCKET_PATH);
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut loona_hpack::Encoder::new(), &headers);
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
        let mut out = Vec::new();
        HeaderBlockRewriter::new().push(&client, &mut out).unwrap();
        let mut rest = &out[PREFACE.len()..];
        let mut kinds = Vec::new();
        let mut joined = Vec::new();
        while let Some(frame) = Frame::parse(rest).unwrap() {
            assert!(frame.payload.len() <= MAX_FRAME_PAYLOAD);
            kinds.push((frame.kind, frame.flags));
            joined.extend_from_slice(frame.payload);
            rest = &rest[frame.wire_length()..];
        }
        assert_eq!(
            kinds,
            [
                (HEADERS, END_STREAM),
                (CONTINUATION, 0),
                (CONTINUATION, END_HEADERS)
            ]
        );
        let decoded = loona_hpack::Decoder::new().decode(&joined).unwrap();
        assert_eq!(decoded[3].1, b"localhost");
        assert_eq!(decoded[6].1.len(), 40_000);
    }

    #[test]
    fn garbage_is_refused_not_passed_on() {
        let mut out = Vec::new();
        assert!(matches!(
            HeaderBlockRewriter::new().push(b"GET / HTTP/1.1\r\n", &mut out),
            Err(RewriteError::Preface)
        ));
        let mut client = PREFACE.to_vec();
        client.extend(frame(CONTINUATION, END_HEADERS, 1, &[0x80]));
        assert!(matches!(
            HeaderBlockRewriter::new().push(&client, &mut out),
            Err(RewriteError::UnexpectedContinuation(1))
        ));
        let mut client = PREFACE.to_vec();
        client.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0x7f],
        ));
        assert!(matches!(
            HeaderBlockRewriter::new().push(&client, &mut out),
            Err(RewriteError::Hpack { stream: 1, .. })
        ));
    }

    #[test]
    fn integers_follow_rfc_7541_examples() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        encode_integer(10, 5, 0, &mut out);
        assert_eq!(out, [0b0000_1010]);
        out.clear();
        encode_integer(1337, 5, 0, &mut out);
        assert_eq!(out, [0b0001_1111, 0b1001_1010, 0b0000_1010]);
        assert!(is_uri_authority(b"localhost") && is_uri_authority(b"example.com:443"));
        assert!(!is_uri_authority(SOCKET_PATH));
    }
}
