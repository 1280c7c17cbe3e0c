//! Discovery streams against test handlers. Each handler runs in a Tokio runtime of its own,
//! so killing it (shutting the runtime down) is what a handler process dying looks like to
//! the plugin: its sockets close, its socket file stays.
//!
//! The test handler encodes ids and property values as `bytes` (same field numbers as
//! `v0.Device`), so it can also send what a well-typed server cannot: non-UTF-8 strings.

use akri_kubelet_plugin::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Endpoint, InvalidDevices, RegisteredHandler,
    StreamConfig, StreamError,
};
use akri_proto::discovery::v0 as proto;
use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::http;
use tonic::{Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct RawResponse {
    #[prost(message, repeated, tag = "1")]
    devices: Vec<RawDevice>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDevice {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
    #[prost(map = "string, bytes", tag = "2")]
    properties: HashMap<String, Vec<u8>>,
}

fn device(id: &str) -> RawDevice {
    RawDevice {
        id: id.as_bytes().to_vec(),
        properties: [("ID".to_string(), id.as_bytes().to_vec())].into(),
    }
}

/// `v0.DiscoveryHandler` answering every `Discover` with one list, then staying silent.
#[derive(Clone)]
struct RawHandler(Vec<RawDevice>);

impl tonic::server::NamedService for RawHandler {
    const NAME: &'static str = proto::discovery_handler_server::SERVICE_NAME;
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<RawResponse, Status>> + Send>>;

impl tonic::server::ServerStreamingService<proto::DiscoverRequest> for RawHandler {
    type Response = RawResponse;
    type ResponseStream = BoxStream;
    type Future = std::future::Ready<Result<Response<BoxStream>, Status>>;

    fn call(&mut self, _: tonic::Request<proto::DiscoverRequest>) -> Self::Future {
        let list = tokio_stream::once(Ok(RawResponse {
            devices: self.0.clone(),
        }));
        let stream: BoxStream = Box::pin(list.chain(tokio_stream::pending()));
        std::future::ready(Ok(Response::new(stream)))
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for RawHandler {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send + 'static>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let handler = self.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<RawResponse, proto::DiscoverRequest>::default();
            Ok(tonic::server::Grpc::new(codec)
                .server_streaming(handler, request)
                .await)
        })
    }
}

/// A handler "process": its own runtime, serving on `socket`.
struct TestHandler(Option<tokio::runtime::Runtime>);

impl TestHandler {
    fn start(socket: &Path, devices: Vec<RawDevice>) -> Self {
        let _ = std::fs::remove_file(socket);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = {
            let _context = runtime.enter();
            tokio::net::UnixListener::bind(socket).unwrap()
        };
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(RawHandler(devices))
                .serve_with_incoming(dra_plugin::authority::incoming(listener)),
        );
        TestHandler(Some(runtime))
    }

    fn kill(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for TestHandler {
    fn drop(&mut self) {
        self.kill();
    }
}

fn uds(name: &str, socket: &Path) -> RegisteredHandler {
    RegisteredHandler {
        name: name.into(),
        endpoint: Endpoint::Uds(socket.to_path_buf()),
        shared: false,
    }
}

fn fast() -> StreamConfig {
    StreamConfig {
        open_timeout: Duration::from_millis(500),
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        ..StreamConfig::default()
    }
}

fn start(handler: RegisteredHandler) -> DiscoveryStream {
    DiscoveryStream::start(handler, DiscoveryRequest::default(), fast())
}

async fn next(stream: &mut DiscoveryStream) -> DiscoveryEvent {
    tokio::time::timeout(Duration::from_secs(5), stream.next_event())
        .await
        .expect("an event within 5 s")
        .expect("the stream lives")
}

async fn next_error(stream: &mut DiscoveryStream) -> StreamError {
    match next(stream).await {
        DiscoveryEvent::Error(error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn ids(event: &DiscoveryEvent) -> Option<Vec<&str>> {
    match event {
        DiscoveryEvent::Devices(devices) => Some(devices.iter().map(|d| d.id.as_str()).collect()),
        DiscoveryEvent::Error(_) => None,
    }
}

#[tokio::test]
async fn reconnects_to_a_restarted_handler() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("h.sock");
    let mut handler = TestHandler::start(&socket, vec![device("a")]);
    let mut stream = start(uds("test", &socket));
    let event = next(&mut stream).await;
    assert_eq!(ids(&event), Some(vec!["a"]));
    assert_eq!(
        match event {
            DiscoveryEvent::Devices(d) => d[0].properties["ID"].clone(),
            _ => unreachable!(),
        },
        "a"
    );

    handler.kill();
    let error = next_error(&mut stream).await;
    assert!(error.to_string().contains("test"), "{error}");

    let _handler = TestHandler::start(&socket, vec![device("b"), device("a")]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let event = next(&mut stream).await;
        if let Some(ids) = ids(&event) {
            assert_eq!(ids, ["a", "b"]);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no devices after the restart"
        );
    }
}

#[tokio::test]
async fn garbage_is_an_error_of_its_own_stream_only() {
    let dir = tempfile::tempdir().unwrap();
    let good_socket = dir.path().join("good.sock");
    let _good = TestHandler::start(&good_socket, vec![device("a"), device("b")]);
    let mut good = start(uds("good", &good_socket));

    let cases = [
        ("empty", vec![device("a"), device("")]),
        ("duplicate", vec![device("a"), device("a")]),
    ];
    let mut bad_handlers = Vec::new();
    let mut bad_streams = Vec::new();
    for (name, devices) in cases {
        let socket = dir.path().join(format!("{name}.sock"));
        bad_handlers.push(TestHandler::start(&socket, devices));
        bad_streams.push(start(uds(name, &socket)));
    }
    match next_error(&mut bad_streams[0]).await {
        StreamError::InvalidDevices {
            handler,
            cause: InvalidDevices::EmptyId { index: 1 },
        } => assert_eq!(handler, "empty"),
        other => panic!("{other:?}"),
    }
    match next_error(&mut bad_streams[1]).await {
        StreamError::InvalidDevices {
            cause: InvalidDevices::DuplicateId { id },
            ..
        } => assert_eq!(id, "a"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ids(&next(&mut good).await), Some(vec!["a", "b"]));
}

#[tokio::test]
async fn too_many_devices_and_non_utf8_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many.sock");
    let _many = TestHandler::start(&many, (0..3).map(|i| device(&format!("d{i}"))).collect());
    let config = StreamConfig {
        max_devices: 2,
        ..fast()
    };
    let mut stream =
        DiscoveryStream::start(uds("many", &many), DiscoveryRequest::default(), config);
    assert!(matches!(
        next_error(&mut stream).await,
        StreamError::InvalidDevices {
            cause: InvalidDevices::TooMany { count: 3, max: 2 },
            ..
        }
    ));

    let latin1 = dir.path().join("latin1.sock");
    let mut bad = device("a");
    bad.properties.insert("NAME".into(), b"caf\xe9".to_vec());
    let _latin1 = TestHandler::start(&latin1, vec![bad]);
    let mut stream = start(uds("latin1", &latin1));
    match next_error(&mut stream).await {
        StreamError::Status { message, .. } => assert!(message.contains("UTF-8"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_handler_that_never_answers_times_out_and_a_missing_one_fails_to_connect() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mute.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let _mute = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    let mut stream = start(uds("mute", &socket));
    assert!(matches!(
        next_error(&mut stream).await,
        StreamError::Timeout { .. }
    ));

    let mut stream = start(uds("absent", &dir.path().join("absent.sock")));
    let error = next_error(&mut stream).await;
    assert!(matches!(error, StreamError::Connect { .. }), "{error:?}");
    // It keeps trying, and keeps saying so.
    assert!(matches!(
        next_error(&mut stream).await,
        StreamError::Connect { .. }
    ));
}

#[tokio::test]
async fn a_network_endpoint_works_too() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RawHandler(vec![device("n")]))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let handler = RegisteredHandler {
        name: "net".into(),
        endpoint: Endpoint::Network(address.to_string()),
        shared: true,
    };
    let mut stream = start(handler);
    assert_eq!(ids(&next(&mut stream).await), Some(vec!["n"]));
}
