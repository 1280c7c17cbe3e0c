//! The discovery-handler registry over its real gRPC socket, and across a plugin restart.

use akri_kubelet_plugin::discovery::{Endpoint, RegisteredHandler, Registry, connect, handler};
use akri_proto::discovery::v0 as proto;
use std::time::Duration;

fn handler(name: &str, endpoint: Endpoint, shared: bool) -> RegisteredHandler {
    RegisteredHandler {
        name: name.into(),
        endpoint,
        shared,
    }
}

#[tokio::test]
async fn registrations_over_grpc_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent-registration.sock");
    let state = dir.path().join("state/handlers.json");

    let registry = Registry::serve(&socket, &state).unwrap();
    assert!(registry.handlers().is_empty());
    let mut watch = registry.subscribe();

    let udev = handler("udev", Endpoint::Uds(dir.path().join("udev.sock")), false);
    handler::register(&socket, &udev).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the watch reports the registration")
        .unwrap();
    assert_eq!(watch.borrow_and_update().get("udev"), Some(&udev));

    let onvif = handler(
        "onvif",
        Endpoint::Network("http://10.0.0.5:10000".into()),
        true,
    );
    handler::register(&socket, &onvif).await.unwrap();
    watch.borrow_and_update();

    // The same registration again changes nothing and wakes no one.
    handler::register(&socket, &onvif).await.unwrap();
    assert!(!watch.has_changed().unwrap());

    // Re-registering a name replaces its endpoint.
    let udev = handler("udev", Endpoint::Uds(dir.path().join("udev-2.sock")), false);
    handler::register(&socket, &udev).await.unwrap();
    assert!(watch.has_changed().unwrap());
    let expected = [
        ("onvif".to_string(), onvif.clone()),
        ("udev".to_string(), udev.clone()),
    ]
    .into();
    assert_eq!(registry.handlers(), expected);

    // Plugin restart: the registry comes back from its state file alone.
    drop(registry);
    assert!(!socket.exists(), "the socket file goes with the registry");
    let registry = Registry::serve(&socket, &state).unwrap();
    assert_eq!(registry.handlers(), expected);

    // ... and still serves registrations.
    let echo = handler("debugEcho", Endpoint::Uds(dir.path().join("e.sock")), true);
    handler::register(&socket, &echo).await.unwrap();
    assert_eq!(registry.handlers().len(), 3);
    assert!(registry.deregister("onvif").await);
    assert!(!registry.deregister("onvif").await);
    drop(registry);
    let registry = Registry::serve(&socket, &state).unwrap();
    assert_eq!(
        registry.handlers().keys().collect::<Vec<_>>(),
        ["debugEcho", "udev"]
    );
}

/// What the code under test logs, kept for assertions.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Logs of this thread (the test runtime's one: the registry's tasks log here too) until
    /// the guard is dropped. Every test of the registry's log lines captures, or a callsite's
    /// interest, cached while another test logged nowhere, may drop its lines.
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish(),
        );
        (logs, guard)
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A name registered again from another endpoint, the first one no longer answering, is taken
/// over, and the log names both endpoints, so an operator can tell which handler took the name.
#[tokio::test]
async fn a_name_taken_over_by_another_endpoint_is_logged_with_both() {
    let (logs, _logging) = Logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent-registration.sock");
    let registry = Registry::serve(&socket, &dir.path().join("handlers.json")).unwrap();
    let (first, second) = (
        dir.path().join("udev-a.sock"),
        dir.path().join("udev-b.sock"),
    );
    handler::register(
        &socket,
        &handler("udev", Endpoint::Uds(first.clone()), false),
    )
    .await
    .unwrap();
    handler::register(
        &socket,
        &handler("udev", Endpoint::Uds(second.clone()), false),
    )
    .await
    .unwrap();
    assert_eq!(
        registry.handlers()["udev"].endpoint,
        Endpoint::Uds(second.clone())
    );
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("registered again from another endpoint"))
        .unwrap_or_else(|| panic!("no takeover line in:\n{text}"));
    assert!(
        line.contains(&first.display().to_string()) && line.contains(&second.display().to_string()),
        "{line}"
    );
}

/// While the endpoint a name was registered from answers, no other endpoint takes the name
/// (a handler pod cannot take another's name, nor the Secret-derived properties its
/// configurations pass it); once it stops answering, the next registration takes it over.
#[tokio::test]
async fn a_live_handlers_name_is_not_taken_over_by_another_endpoint() {
    let (logs, _logging) = Logs::capture();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent-registration.sock");
    let registry = Registry::serve(&socket, &dir.path().join("handlers.json")).unwrap();
    let (first, second) = (
        dir.path().join("onvif-a.sock"),
        dir.path().join("onvif-b.sock"),
    );
    let listening = tokio::net::UnixListener::bind(&first).unwrap();
    let onvif = handler("onvif", Endpoint::Uds(first.clone()), false);
    handler::register(&socket, &onvif).await.unwrap();
    let impostor = handler("onvif", Endpoint::Uds(second.clone()), false);
    let refused = handler::register(&socket, &impostor)
        .await
        .expect_err("the first endpoint still answers");
    assert!(
        refused.to_string().contains("which still answers"),
        "{refused}"
    );
    assert_eq!(
        registry.handlers()["onvif"].endpoint,
        Endpoint::Uds(first.clone())
    );
    let text = logs.text();
    let line = (text.lines())
        .find(|l| l.contains("refused a second endpoint"))
        .unwrap_or_else(|| panic!("no refusal line in:\n{text}"));
    assert!(
        line.contains(&first.display().to_string()) && line.contains(&second.display().to_string()),
        "{line}"
    );
    // The first handler is gone (its socket file stays, nobody listens).
    drop(listening);
    handler::register(&socket, &impostor)
        .await
        .expect("a dead endpoint's name is free");
    assert_eq!(registry.handlers()["onvif"].endpoint, Endpoint::Uds(second));
}

/// The chart gives each of its handler pods a directory of its own. The handler's name then
/// registers only from there, even from a live endpoint elsewhere, and the socket it names is
/// the one in its directory whatever path its mount makes of it; another name cannot register
/// there. An endpoint recorded before the directory existed serves until the handler registers
/// from it, so that a chart upgrade keeps the handler's devices.
#[tokio::test]
async fn a_handler_with_its_own_directory_registers_only_from_there() {
    use akri_kubelet_plugin::discovery::registry::{OwnDirectory, SOCKET_NAME};
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(SOCKET_NAME);
    let state = dir.path().join("state/handlers.json");
    // Before: registered through the common socket, and alive.
    let old = dir.path().join("opcua.sock");
    let _old_listening = tokio::net::UnixListener::bind(&old).unwrap();
    let registry = Registry::serve(&socket, &state).unwrap();
    handler::register(
        &socket,
        &handler("opcua", Endpoint::Uds(old.clone()), false),
    )
    .await
    .unwrap();
    drop(registry);

    // The chart's handler group, where the test may give files to it (CI runs as root).
    let gid = match std::fs::metadata("/proc/self").unwrap().uid() {
        0 => 65532,
        _ => std::fs::metadata(dir.path()).unwrap().gid(),
    };
    let own: OwnDirectory = format!("opcua:{gid}").parse().unwrap();
    let mut registry = Registry::load(&socket, &state, &[own]);
    registry.serve_on().unwrap();
    let own_dir = dir.path().join("opcua");
    let made = std::fs::symlink_metadata(&own_dir).unwrap();
    assert!(made.is_dir());
    assert_eq!((made.gid(), made.mode() & 0o777), (gid, 0o770));
    let own_socket = own_dir.join(SOCKET_NAME);
    let served = std::fs::symlink_metadata(&own_socket).unwrap();
    assert!(served.file_type().is_socket());
    assert_eq!(served.permissions().mode() & 0o777, 0o666);
    assert_eq!(
        registry.handlers()["opcua"].endpoint,
        Endpoint::Uds(old.clone()),
        "the recorded endpoint serves until the handler registers from its directory"
    );

    // Its name, in any case, from the common socket: refused, whatever answers where.
    for name in ["opcua", "OPCUA"] {
        let impostor = handler(name, Endpoint::Uds(dir.path().join("x.sock")), false);
        let refused = handler::register(&socket, &impostor)
            .await
            .expect_err("an own directory's name registers only from there");
        assert!(
            refused
                .to_string()
                .contains("only through its own directory")
                && refused
                    .to_string()
                    .contains(&own_socket.display().to_string()),
            "{refused}"
        );
    }
    // Another name from the directory: refused.
    let other = handler(
        "udev",
        Endpoint::Uds("/var/lib/akri/udev.sock".into()),
        false,
    );
    let refused = handler::register(&own_socket, &other).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("registers only discovery handler")
            && refused.to_string().contains("opcua"),
        "{refused}"
    );
    assert!(!registry.handlers().contains_key("udev"));

    // The handler itself, naming its socket as its mount shows it: the file in its directory,
    // taking over from the old endpoint although that one still answers.
    let opcua = handler(
        "opcua",
        Endpoint::Uds("/var/lib/akri/opcua.sock".into()),
        false,
    );
    handler::register(&own_socket, &opcua).await.unwrap();
    assert_eq!(
        registry.handlers()["opcua"].endpoint,
        Endpoint::Uds(own_dir.join("opcua.sock"))
    );
    drop(registry);
    assert!(
        !own_socket.exists(),
        "the own socket goes with the registry"
    );
}

/// What a handler can make in its own directory cannot stop the agent (issue 52): a
/// directory where the agent's socket goes, with something in it, made while the agent was
/// down. rename(2) would not replace it, and the agent did not start, nor any of the node's
/// drivers; now it is moved out and removed, and every socket serves.
#[tokio::test]
async fn a_directory_a_handler_made_where_its_socket_goes_stops_nothing() {
    use akri_kubelet_plugin::discovery::registry::{OwnDirectory, SOCKET_NAME};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(SOCKET_NAME);
    let state = dir.path().join("state/handlers.json");
    let gid = match std::fs::metadata("/proc/self").unwrap().uid() {
        0 => 65532,
        _ => std::fs::metadata(dir.path()).unwrap().gid(),
    };
    let squatted = dir.path().join("opcua").join(SOCKET_NAME);
    std::fs::create_dir_all(squatted.join("deeper")).unwrap();
    std::fs::write(squatted.join("deeper/file"), "x").unwrap();
    let own: Vec<OwnDirectory> = (["opcua", "onvif"].iter())
        .map(|name| format!("{name}:{gid}").parse().unwrap())
        .collect();
    let mut registry = Registry::load(&socket, &state, &own);
    registry
        .serve_on()
        .expect("the agent serves whatever a handler made in its directory");
    for name in ["opcua", "onvif"] {
        let own_socket = dir.path().join(name).join(SOCKET_NAME);
        let served = std::fs::symlink_metadata(&own_socket).unwrap();
        assert!(served.file_type().is_socket(), "{name}");
    }
    let opcua = handler(
        "opcua",
        Endpoint::Uds("/var/lib/akri/opcua.sock".into()),
        false,
    );
    handler::register(&squatted, &opcua).await.unwrap();
    let udev = handler("udev", Endpoint::Uds(dir.path().join("udev.sock")), false);
    handler::register(&socket, &udev).await.unwrap();
    assert_eq!(
        registry.handlers().keys().collect::<Vec<_>>(),
        ["opcua", "udev"]
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        !left.iter().any(|n| n.to_string_lossy().ends_with(".aside")),
        "the moved directory is removed: {left:?}"
    );
}

#[tokio::test]
async fn refuses_bad_registrations_and_query_device_info() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("reg.sock");
    let registry = Registry::serve(&socket, &dir.path().join("handlers.json")).unwrap();
    let channel = connect::unix_channel(&socket).await.unwrap();
    let mut client = proto::registration_client::RegistrationClient::new(channel);

    let status = client
        .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest {
            name: "udev".into(),
            endpoint: "relative.sock".into(),
            endpoint_type: 0,
            shared: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("not absolute"), "{status}");
    assert!(registry.handlers().is_empty());

    // Names become DRA driver names, CDI classes and paths on the node.
    for (name, why) in [
        ("../../etc/cron.d/x", "must start with a letter"),
        ("a/b", "'/'"),
        ("2cams", "must start with a letter"),
        ("cam.v2", "'.'"),
        (&"h".repeat(55), "at most 54"),
    ] {
        let status = client
            .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest {
                name: name.into(),
                endpoint: "/run/h.sock".into(),
                endpoint_type: 0,
                shared: false,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{name}");
        assert!(status.message().contains(why), "{name}: {status}");
    }
    assert!(registry.handlers().is_empty());

    // Two names that are one driver: the second is refused, the first keeps working.
    let echo = handler("debugEcho", Endpoint::Uds("/run/echo.sock".into()), false);
    handler::register(&socket, &echo).await.unwrap();
    let status = client
        .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest {
            name: "DebugEcho".into(),
            endpoint: "/run/other.sock".into(),
            endpoint_type: 0,
            shared: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert!(
        status.message().contains("differs only in case"),
        "{status}"
    );
    assert_eq!(registry.handlers().get("debugEcho"), Some(&echo));
    assert_eq!(registry.handlers().len(), 1);

    let status = client
        .query_device_info(proto::QueryDeviceInfoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert!(status.message().contains("QueryDeviceInfo"), "{status}");
}

#[tokio::test]
async fn a_corrupt_state_file_is_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("handlers.json");
    std::fs::write(&state, "{ truncated").unwrap();
    let socket = dir.path().join("reg.sock");
    let registry = Registry::serve(&socket, &state).unwrap();
    assert!(registry.handlers().is_empty());
    let udev = handler("udev", Endpoint::Uds("/run/udev.sock".into()), false);
    handler::register(&socket, &udev).await.unwrap();
    drop(registry);
    let registry = Registry::serve(&socket, &state).unwrap();
    assert_eq!(registry.handlers().get("udev"), Some(&udev));
}

/// Akri's agent serves the same default path. A socket another live process serves is never
/// taken: the registry refuses, naming the path and how to move ours, and the other process
/// keeps its socket. Once that process is gone, its stale socket file is replaced as after a
/// crash of our own.
#[tokio::test]
async fn a_socket_another_live_process_serves_is_not_taken() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent-registration.sock");
    let state = dir.path().join("state/handlers.json");
    // Another process (as a running Akri agent would be) listening on the path.
    // Killed when the test ends, however it ends.
    struct Other(std::process::Child);
    impl Drop for Other {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut other = Other(
        std::process::Command::new("python3")
            .args([
                "-c",
                "import socket, sys, time\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.bind(sys.argv[1])\n\
             s.listen(16)\n\
             print('listening', flush=True)\n\
             time.sleep(120)",
            ])
            .arg(&socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs"),
    );
    let mut line = String::new();
    std::io::BufReader::new(other.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "listening");

    let error = Registry::serve(&socket, &state).unwrap_err().to_string();
    assert!(
        error.contains(&socket.display().to_string()) && error.contains("--discovery-socket"),
        "names the path and the way out: {error}"
    );
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        "the other process still serves its socket"
    );

    // Gone, its socket file left behind: taken over.
    drop(other);
    assert!(socket.exists(), "the stale socket file stays behind");
    let registry = Registry::serve(&socket, &state).unwrap();
    let echo = handler(
        "debugEcho",
        Endpoint::Uds(dir.path().join("echo.sock")),
        false,
    );
    handler::register(&socket, &echo).await.unwrap();
    assert_eq!(registry.handlers().get("debugEcho"), Some(&echo));
}
