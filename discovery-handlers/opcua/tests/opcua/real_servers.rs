//! The OPC UA handler against real OPC UA servers (asyncua, from PyPI): a Local Discovery
//! Server with servers registered to it, and a server found through its own discovery URL.

use akri_discovery_handler::client::discover;
use akri_discovery_handler::{Served, proto};
use akri_opcua::Opcua;
use akri_testing::peers::Peer;
use std::path::Path;
use std::time::Duration;

fn url(port: u16) -> String {
    format!("opc.tcp://127.0.0.1:{port}/")
}

/// An asyncua server named `name` on `port`, of `kind` (client-and-server, server or
/// discovery), registered with the discovery server at `lds` if given.
fn server(name: &str, port: u16, kind: &str, lds: Option<u16>) -> Peer {
    let mut args = vec![
        "--port".to_string(),
        port.to_string(),
        "--name".into(),
        name.into(),
        "--type".into(),
        kind.into(),
    ];
    if let Some(lds) = lds {
        args.extend(["--register-to".into(), url(lds)]);
    }
    Peer::start(name, "opcua_server.py", &args).expect("the OPC UA server starts")
}

fn details(urls: &[String], names: &str) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("'{u}'")).collect();
    format!(
        "opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: [{}]\n{names}",
        urls.join(", ")
    )
}

async fn next(
    stream: &mut tonic::Streaming<proto::DiscoverResponse>,
) -> Result<Vec<proto::Device>, tonic::Status> {
    let message = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an answer within 30 s")?;
    Ok(message.expect("the stream is open").devices)
}

fn ids(devices: &[proto::Device]) -> Vec<String> {
    devices.iter().map(|d| d.id.clone()).collect()
}

fn serve(dir: &Path) -> Served {
    let opcua = Opcua {
        rescan: Duration::from_millis(500),
        finder: akri_opcua::Finder {
            pki_dir: dir.join("pki"),
            timeout: Duration::from_secs(3),
        },
    };
    Served::start(opcua, &dir.join("opcua.sock")).unwrap()
}

#[tokio::test]
async fn servers_behind_a_discovery_server_and_on_their_own_are_found_as_the_filter_admits() {
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("opcua.sock");
    let port = || akri_testing::free_port().unwrap();
    let (lds, boiler, conveyor, press) = (port(), port(), port(), port());
    let _lds = server("LDS", lds, "discovery", None);
    let _boiler = server("Boiler", boiler, "client-and-server", Some(lds));
    let mut conveyor_server = server("Conveyor", conveyor, "server", Some(lds));
    let _press = server("Press", press, "server", None);

    // Through the discovery server: the servers registered there, not the discovery server.
    let mut stream = discover(&socket, &details(&[url(lds)], ""), &[])
        .await
        .unwrap();
    let mut devices = next(&mut stream).await.unwrap();
    // Registration with the LDS can trail the servers' start by a moment.
    while devices.len() < 2 {
        devices = next(&mut stream).await.unwrap();
    }
    // Devices go out in id order, and the ports are random.
    let mut expected = [url(boiler), url(conveyor)];
    expected.sort();
    assert_eq!(ids(&devices), expected);
    let boiler_device = devices.iter().find(|d| d.id == url(boiler)).unwrap();
    assert_eq!(boiler_device.properties["OPCUA_DISCOVERY_URL"], url(boiler));
    assert_eq!(boiler_device.properties["OPCUA_APPLICATION_NAME"], "Boiler");
    assert_eq!(
        boiler_device.properties["OPCUA_APPLICATION_URI"],
        "urn:akri-test:Boiler"
    );

    // A server that stops is removed, though the discovery server still lists it.
    conveyor_server.kill();
    assert_eq!(ids(&next(&mut stream).await.unwrap()), [url(boiler)]);
    drop(stream);

    // Application-name filters.
    let include = "applicationNames:\n  action: Include\n  items: [Press]\n";
    let mut stream = discover(&socket, &details(&[url(lds), url(press)], include), &[])
        .await
        .unwrap();
    assert_eq!(ids(&next(&mut stream).await.unwrap()), [url(press)]);
    let exclude = "applicationNames:\n  action: Exclude\n  items: [Press]\n";
    let mut stream = discover(&socket, &details(&[url(lds), url(press)], exclude), &[])
        .await
        .unwrap();
    assert_eq!(ids(&next(&mut stream).await.unwrap()), [url(boiler)]);
    // A server's own discovery URL, no discovery server.
    let mut stream = discover(&socket, &details(&[url(press)], ""), &[])
        .await
        .unwrap();
    assert_eq!(ids(&next(&mut stream).await.unwrap()), [url(press)]);
}

#[tokio::test]
async fn an_unreachable_discovery_url_fails_the_stream_and_a_later_call_finds_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("opcua.sock");
    let port = akri_testing::free_port().unwrap();
    let mut stream = discover(&socket, &details(&[url(port)], ""), &[])
        .await
        .unwrap();
    let status = next(&mut stream).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status
            .message()
            .contains("no OPC UA discovery URL answered")
            && status.message().contains(&url(port)),
        "{}",
        status.message()
    );
    // It comes up; the agent's next call (after its backoff) finds it.
    let _late = server("Late", port, "server", None);
    let mut stream = discover(&socket, &details(&[url(port)], ""), &[])
        .await
        .unwrap();
    assert_eq!(ids(&next(&mut stream).await.unwrap()), [url(port)]);
}

#[tokio::test]
async fn bad_details_fail_the_call_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("opcua.sock");
    for (details, says) in [
        ("", "opcuaDiscoveryMethod"),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: []}}",
            "empty",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://10.0.0.1/']}}",
            "must be opc.tcp://",
        ),
        (
            "opcuaDiscoveryMethod: {standard: {}}\napplicationNames: {action: Keep}",
            "Keep",
        ),
    ] {
        let status = discover(&socket, details, &[]).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{details}");
        assert!(
            status.message().starts_with("opcua discovery details: ")
                && status.message().contains(says),
            "{details}: {}",
            status.message()
        );
    }
}
