//! Serving gRPC on a Unix socket to clients that send the socket path as `:authority`.
//!
//! The kubelet's plugin watcher (Kubernetes 1.36 included) dials a plugin's registration
//! socket by its path without overriding the authority, so grpc-go sends the percent-encoded
//! path (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F...`) as `:authority`. The `http` crate
//! rejects that, so h2, and with it tonic, reset every such request with PROTOCOL_ERROR
//! (hyperium/h2#487; the kubelet fixed its device-plugin and CSI clients in
//! kubernetes/kubernetes#112597, not this one). The failure is silent on the plugin side: the
//! kubelet retries forever and the driver never registers.
//!
//! [`incoming`] accepts on a Unix socket and hands tonic an in-memory stream per connection.
//! Client-to-server bytes pass through an HTTP/2 frame filter that re-encodes each request's
//! header block with `:authority: localhost`; every other frame, and every byte from server
//! to client, passes through unchanged.

use fluke_hpack::Decoder;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixListener;
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may announce; we never send bigger frames.
const MAX_FRAME: usize = 16_384;
/// The most header-block bytes (compressed, over HEADERS + CONTINUATION) and decoded header
/// bytes one request may carry. gRPC requests from the kubelet carry a few hundred; without a
/// bound a client could make us buffer without end (a CONTINUATION flood) or decode a small
/// block that references a dynamic-table entry over and over into gigabytes.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Bytes buffered between the socket and tonic, per direction.
const BUFFER: usize = 64 * 1024;

/// Only the owner (the kubelet and the plugin run as root) may connect: the mode of the
/// kubelet-facing sockets.
pub const OWNER_ONLY: u32 = 0o600;

/// Binds a Unix socket at `path` for a server: creates its directory and replaces a socket
/// file left by an earlier run (a restarted plugin must take its old path back). Connecting
/// needs write permission on the socket, so `mode` says who may call the server; it is set
/// explicitly rather than left to the umask.
pub fn bind(path: &std::path::Path, mode: u32) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Like [`bind`], but refuses a path that another live process serves (a connection to it is
/// accepted), with [`io::ErrorKind::AddrInUse`]: for a socket another program may use at the
/// same path, as Akri's agent does with the discovery-handler registration socket. A socket
/// file whose server is gone (the connection is refused) is replaced, as after a crash.
pub fn bind_unless_served(path: &std::path::Path, mode: u32) -> io::Result<UnixListener> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another live process serves this socket",
        ));
    }
    bind(path, mode)
}

/// Like [`bind`], for a socket in a directory that another, less trusted user owns (a
/// discovery handler's own directory): the socket is bound at `staging`, a path in a directory
/// only we write on the same filesystem, given its mode there, then renamed onto `path`. The
/// rename is the one thing done by path in the other user's directory, and it replaces
/// whatever is at `path` (a symlink included; a directory is first moved out into ours)
/// instead of following it, so that user cannot turn our chmod onto another file or keep us
/// from serving there.
pub fn bind_via(
    staging: &std::path::Path,
    path: &std::path::Path,
    mode: u32,
) -> io::Result<UnixListener> {
    let listener = bind(staging, mode)?;
    let renamed = match std::fs::rename(staging, path) {
        // rename(2) replaces a file or a symlink at `path`, not a directory: the other user
        // could keep us from serving with `mkdir path`. The directory is moved into our own
        // (by name, atomically: what is moved is whatever is there then) and removed there,
        // where the other user cannot reach into it; then the socket takes its place.
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::IsADirectory | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            let aside = staging.with_file_name(format!(
                "{}.aside",
                staging.file_name().unwrap_or_default().to_string_lossy()
            ));
            let _ = std::fs::remove_dir_all(&aside);
            std::fs::rename(path, &aside).and_then(|()| {
                let _ = std::fs::remove_dir_all(&aside);
                std::fs::rename(staging, path)
            })
        }
        renamed => renamed,
    };
    if let Err(error) = renamed {
        let _ = std::fs::remove_file(staging);
        return Err(error);
    }
    Ok(listener)
}

/// A gRPC channel to a server on the Unix socket at `path` (the client side of [`bind`]).
pub async fn connect(
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    connect_with(
        tonic::transport::Endpoint::from_static("http://localhost"),
        path,
    )
    .await
}

/// [`connect`] with `endpoint`'s settings (keepalive, timeouts); its URI is not used.
pub async fn connect_with(
    endpoint: tonic::transport::Endpoint,
    path: &std::path::Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = path.to_path_buf();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// Serves `router` on `listener` (through [`incoming`]) on a task of its own, logging why it
/// stopped as `what` if it does: the one way every gRPC server on a Unix socket here runs.
/// Aborting the task stops serving and closes the connections.
pub fn spawn(
    listener: UnixListener,
    router: tonic::transport::server::Router,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(error) = router.serve_with_incoming(incoming(listener)).await {
            tracing::error!(%error, "{what} stopped");
        }
    })
}

/// [`bind`]s `socket` with `mode` and [`spawn`]s `router` on it: a gRPC server on a Unix
/// socket, in one call.
pub fn serve(
    socket: &std::path::Path,
    mode: u32,
    router: tonic::transport::server::Router,
    what: &'static str,
) -> io::Result<tokio::task::JoinHandle<()>> {
    Ok(spawn(bind(socket, mode)?, router, what))
}

/// Connections accepted on `listener`, with `:authority` rewritten to `localhost`, ready for
/// `tonic::transport::Server::serve_with_incoming`.
///
/// Dropping the stream (e.g. aborting the server task) also closes every connection it
/// accepted, as a process exit would: otherwise clients keep talking to a server that is gone.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<DuplexStream>> {
    let (alive, _) = tokio::sync::watch::channel(());
    UnixListenerStream::new(listener).map(move |accepted| {
        let socket = accepted?;
        let (to_tonic, tonic_side) = tokio::io::duplex(BUFFER);
        let mut closed = alive.subscribe();
        tokio::spawn(async move {
            let (socket_read, mut socket_write) = socket.into_split();
            let (tonic_read, tonic_write) = tokio::io::split(to_tonic);
            let upstream = rewrite_authority(socket_read, tonic_write);
            let downstream = async {
                let mut tonic_read = tonic_read;
                tokio::io::copy(&mut tonic_read, &mut socket_write).await
            };
            // Either direction ending (or failing on a malformed frame) ends this connection
            // only; the stream being dropped ends them all.
            let result = tokio::select! {
                r = upstream => r,
                r = downstream => r.map(|_| ()),
                _ = closed.changed() => Ok(()),
            };
            if let Err(error) = result {
                tracing::debug!(%error, "gRPC connection on a Unix socket ended with an error");
            }
        });
        Ok(tonic_side)
    })
}

/// Copies an HTTP/2 client byte stream, replacing `:authority` in every header block.
pub async fn rewrite_authority<R, W>(mut from: R, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;

    let mut decoder = Decoder::new();
    // A header block split over HEADERS + CONTINUATION frames, until END_HEADERS.
    let mut block = Vec::new();
    let mut open: Option<OpenBlock> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return to.shutdown().await,
            Err(e) => return Err(e),
        }
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        if length > MAX_FRAME {
            // The server never announces a larger SETTINGS_MAX_FRAME_SIZE.
            return Err(invalid("frame larger than the maximum frame size"));
        }
        let (kind, flags) = (head[3], head[4]);
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;

        match kind {
            FRAME_HEADERS => {
                let (priority, fragment) = headers_fragment(flags, &payload)?;
                block.clear();
                block.extend_from_slice(fragment);
                open = Some(OpenBlock {
                    stream_id,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    priority,
                });
            }
            FRAME_CONTINUATION if open.as_ref().is_some_and(|o| o.stream_id == stream_id) => {
                block.extend_from_slice(&payload);
            }
            FRAME_CONTINUATION => return Err(invalid("CONTINUATION without HEADERS")),
            _ if open.is_some() => return Err(invalid("frame inside a header block")),
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if block.len() > MAX_HEADER_BLOCK {
            return Err(invalid("header block too large"));
        }
        if flags & FLAG_END_HEADERS != 0 {
            let header_block = open.take().expect("a block is open");
            // Decoded field by field (indexed fields are borrowed from the table), counting as
            // RFC 7541 does (name + value + 32), so an inflating block costs nothing to refuse.
            let mut headers = Vec::new();
            let mut decoded = 0;
            decoder
                .decode_with_cb(&block, |name, value| {
                    decoded += name.len() + value.len() + 32;
                    if decoded <= MAX_HEADER_BLOCK {
                        headers.push((name.into_owned(), value.into_owned()));
                    }
                })
                .map_err(|e| invalid(&format!("HPACK: {e:?}")))?;
            if decoded > MAX_HEADER_BLOCK {
                return Err(invalid("decoded header list too large"));
            }
            let encoded = encode_literal_block(&headers);
            write_header_frames(&mut to, &header_block, &encoded).await?;
        }
    }
}

struct OpenBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
}

/// The header block fragment of a HEADERS frame, without padding, and its priority fields.
fn headers_fragment(flags: u8, payload: &[u8]) -> io::Result<(Option<[u8; 5]>, &[u8])> {
    let mut body = payload;
    if flags & FLAG_PADDED != 0 {
        let (&pad, rest) = body
            .split_first()
            .ok_or_else(|| invalid("empty padded frame"))?;
        body = rest
            .get(
                ..rest
                    .len()
                    .checked_sub(pad as usize)
                    .ok_or_else(|| invalid("bad padding"))?,
            )
            .ok_or_else(|| invalid("bad padding"))?;
    }
    let mut priority = None;
    if flags & FLAG_PRIORITY != 0 {
        let fields = body
            .get(..5)
            .ok_or_else(|| invalid("short priority fields"))?;
        priority = Some(fields.try_into().expect("five bytes"));
        body = &body[5..];
    }
    Ok((priority, body))
}

/// HPACK "literal header field without indexing, new name" for every header: no dynamic
/// table on our side, so nothing to keep in step with the server's decoder.
fn encode_literal_block(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let value: &[u8] = if name == b":authority" {
            b"localhost"
        } else {
            value
        };
        out.push(0x00);
        encode_string(&mut out, name);
        encode_string(&mut out, value);
    }
    out
}

/// An HPACK string literal without Huffman coding (RFC 7541 section 5.2).
fn encode_string(out: &mut Vec<u8>, bytes: &[u8]) {
    encode_integer(out, bytes.len(), 7, 0x00);
    out.extend_from_slice(bytes);
}

/// An HPACK integer with an N-bit prefix (RFC 7541 section 5.1).
fn encode_integer(out: &mut Vec<u8>, mut value: usize, prefix_bits: u8, first_byte: u8) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(first_byte | value as u8);
        return;
    }
    out.push(first_byte | max_prefix as u8);
    value -= max_prefix;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// Writes a header block as one HEADERS frame and as many CONTINUATION frames as needed.
async fn write_header_frames<W: AsyncWrite + Unpin>(
    to: &mut W,
    block: &OpenBlock,
    encoded: &[u8],
) -> io::Result<()> {
    let mut first = Vec::new();
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if let Some(priority) = block.priority {
        flags |= FLAG_PRIORITY;
        first.extend_from_slice(&priority);
    }
    let room = MAX_FRAME - first.len();
    let (head, mut rest) = encoded.split_at(encoded.len().min(room));
    first.extend_from_slice(head);
    let mut kind = FRAME_HEADERS;
    let mut payload = first;
    loop {
        let last = rest.is_empty();
        let frame_flags = if last {
            flags | FLAG_END_HEADERS
        } else {
            flags
        };
        write_frame(to, kind, frame_flags, block.stream_id, &payload).await?;
        if last {
            return Ok(());
        }
        let (next, remaining) = rest.split_at(rest.len().min(MAX_FRAME));
        payload = next.to_vec();
        rest = remaining;
        kind = FRAME_CONTINUATION;
        flags = 0;
    }
}

async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    kind: u8,
    flags: u8,
    stream_id: u32,
    payload: &[u8],
) -> io::Result<()> {
    let length = (payload.len() as u32).to_be_bytes();
    let mut head = [0u8; 9];
    head[..3].copy_from_slice(&length[1..]);
    head[3] = kind;
    head[4] = flags;
    head[5..].copy_from_slice(&stream_id.to_be_bytes());
    to.write_all(&head).await?;
    to.write_all(payload).await
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A HEADERS frame as grpc-go sends it: indexed `:method POST` and `:scheme http`, a
    /// literal `:authority` with incremental indexing (static name index 1), `:path`.
    fn client_headers(authority: &str, path: &str) -> Vec<u8> {
        let mut block = vec![0x83, 0x86];
        block.push(0x41);
        encode_string(&mut block, authority.as_bytes());
        block.push(0x44);
        encode_string(&mut block, path.as_bytes());
        block
    }

    async fn run(input: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        rewrite_authority(&input[..], &mut out).await?;
        Ok(out)
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test]
    async fn rewrites_authority_and_keeps_other_frames() {
        let settings = frame(0x4, 0, 0, &[]);
        let data = frame(0x0, FLAG_END_STREAM, 1, b"hello");
        let headers = frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &client_headers(
                "%2Ftmp%2Fplugins_registry%2Fx.sock",
                "/pluginregistration.Registration/GetInfo",
            ),
        );
        let input = [PREFACE.to_vec(), settings.clone(), headers, data.clone()].concat();
        let out = run(input).await.unwrap();

        assert!(out.starts_with(PREFACE));
        let rest = &out[24..];
        assert!(rest.starts_with(&settings));
        let rest = &rest[settings.len()..];
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        assert_eq!((rest[3], rest[4]), (FRAME_HEADERS, FLAG_END_HEADERS));
        let decoded = Decoder::new().decode(&rest[9..9 + length]).unwrap();
        let authority = decoded.iter().find(|(n, _)| n == b":authority").unwrap();
        assert_eq!(authority.1, b"localhost");
        let path = decoded.iter().find(|(n, _)| n == b":path").unwrap();
        assert_eq!(path.1, b"/pluginregistration.Registration/GetInfo");
        assert_eq!(&rest[9 + length..], &data[..]);
    }

    #[tokio::test]
    async fn joins_continuations_and_keeps_the_dynamic_table_in_step() {
        // Two requests: the second refers to the first's `:authority` through the dynamic
        // table (index 63: `:path` was added after it), as an HPACK encoder does.
        let block = client_headers("%2Fa.sock", "/s/M");
        let (part1, part2) = block.split_at(3);
        let first = [
            frame(
                FRAME_HEADERS,
                FLAG_PADDED,
                1,
                &[&[2u8][..], part1, &[0, 0]].concat(),
            ),
            frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 1, part2),
        ]
        .concat();
        let second = frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &[0x83, 0x86, 0xbf, 0x44, 0x04, b'/', b's', b'/', b'N'],
        );
        let out = run([PREFACE.to_vec(), first, second].concat())
            .await
            .unwrap();

        let mut rest = &out[24..];
        let mut decoder = Decoder::new();
        let mut seen = Vec::new();
        while !rest.is_empty() {
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            assert_eq!(rest[3], FRAME_HEADERS);
            assert_ne!(rest[4] & FLAG_END_HEADERS, 0);
            let headers = decoder.decode(&rest[9..9 + length]).unwrap();
            seen.push((rest[4] & FLAG_END_STREAM != 0, headers));
            rest = &rest[9 + length..];
        }
        assert_eq!(seen.len(), 2);
        for (_, headers) in &seen {
            let authority = headers.iter().find(|(n, _)| n == b":authority").unwrap();
            assert_eq!(authority.1, b"localhost");
        }
        assert!(!seen[0].0 && seen[1].0, "END_STREAM stays where it was");
    }

    #[tokio::test]
    async fn rejects_garbage() {
        assert!(
            run(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
                .await
                .is_err()
        );
        let bad_hpack = frame(
            FRAME_HEADERS,
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff],
        );
        assert!(run([PREFACE.to_vec(), bad_hpack].concat()).await.is_err());
    }

    /// A client that never ends its header block, or inflates it through the dynamic table,
    /// is cut off after a bounded amount of work instead of being buffered without end.
    #[tokio::test]
    async fn bounds_continuation_floods() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let proxy = tokio::spawn(async move { rewrite_authority(server, tokio::io::sink()).await });
        client.write_all(PREFACE).await.unwrap();
        client
            .write_all(&frame(FRAME_HEADERS, 0, 1, &[0x83]))
            .await
            .unwrap();
        let continuation = frame(FRAME_CONTINUATION, 0, 1, &[0x86; MAX_FRAME]);
        let mut sent = 0;
        // A flood of 64 MiB; the proxy must give up long before.
        while sent < 64 << 20 {
            if client.write_all(&continuation).await.is_err() {
                break;
            }
            sent += continuation.len();
        }
        // A proxy that took it all ends when the client goes, and must not have taken it.
        drop(client);
        let result = proxy.await.unwrap();
        assert!(
            sent < 2 * MAX_HEADER_BLOCK,
            "read {sent} bytes of the flood ({result:?})"
        );
        let error = result.unwrap_err();
        assert!(
            error.to_string().contains("header block too large"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn refuses_frames_over_the_maximum_size() {
        // One frame announcing 16 MiB: refused from its header, before any payload is read.
        let huge = [
            &[0xff, 0xff, 0xff, FRAME_HEADERS, 0][..],
            &1u32.to_be_bytes(),
        ]
        .concat();
        let error = run([PREFACE.to_vec(), huge].concat()).await.unwrap_err();
        assert!(error.to_string().contains("maximum frame size"), "{error}");
    }

    #[tokio::test]
    async fn bounds_decoded_header_lists() {
        // A 4 KB value put in the dynamic table once, then referenced 60,000 times.
        let mut block = vec![0x40];
        encode_string(&mut block, b"x-big");
        encode_string(&mut block, &[b'v'; 4000]);
        block.extend(std::iter::repeat_n(0xbe, 60_000));
        let frames: Vec<u8> = block
            .chunks(MAX_FRAME)
            .enumerate()
            .map(|(i, chunk)| {
                let last = (i + 1) * MAX_FRAME >= block.len();
                let kind = if i == 0 {
                    FRAME_HEADERS
                } else {
                    FRAME_CONTINUATION
                };
                frame(kind, if last { FLAG_END_HEADERS } else { 0 }, 1, chunk)
            })
            .collect::<Vec<_>>()
            .concat();
        let error = run([PREFACE.to_vec(), frames].concat()).await.unwrap_err();
        assert!(error.to_string().contains("too large"), "{error}");
    }

    /// A symlink planted where the socket goes is replaced, and the file it named keeps its
    /// mode: what a handler owning the directory could try.
    #[tokio::test]
    async fn bind_via_replaces_a_planted_symlink_without_following_it() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let ours = tempfile::tempdir().unwrap();
        let theirs = tempfile::tempdir().unwrap();
        let victim = ours.path().join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let path = theirs.path().join("agent-registration.sock");
        std::os::unix::fs::symlink(&victim, &path).unwrap();

        let _listener = bind_via(&ours.path().join("staging.sock"), &path, 0o666).unwrap();

        let socket = std::fs::symlink_metadata(&path).unwrap();
        assert!(socket.file_type().is_socket(), "{:?}", socket.file_type());
        assert_eq!(socket.permissions().mode() & 0o777, 0o666);
        let victim = std::fs::metadata(&victim).unwrap();
        assert_eq!(victim.permissions().mode() & 0o777, 0o600);
        assert!(!ours.path().join("staging.sock").exists());
        std::os::unix::net::UnixStream::connect(&path).expect("served at the new path");
    }

    #[test]
    fn integers_follow_rfc_7541() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        encode_integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]);
        let mut out = Vec::new();
        encode_integer(&mut out, 10, 5, 0);
        assert_eq!(out, [10]);
    }
}
