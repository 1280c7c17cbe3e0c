//! The ONVIF handler against real WS-Discovery peers (WSDiscovery, from PyPI) publishing
//! NetworkVideoTransmitters on the multicast group, each with a device service that checks
//! WS-Security digests as cameras do (`hack/peers/onvif_camera.py`).

use akri_discovery_handler::client::discover;
use akri_discovery_handler::{Served, proto};
use akri_onvif::Onvif;
use akri_testing::peers::Peer;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// Peers on the multicast group answer every probe on this machine: the tests of this file
/// run one at a time, and each asks only for its own cameras' uuids.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PASSWORD: &str = "s3cret-Pa55";

struct Camera {
    uuid: String,
    port: u16,
    peer: Peer,
}

fn camera(name: &str, location: &str, ip: &str, mac: &str, auth: bool) -> Camera {
    camera_with(name, location, ip, mac, auth, &[])
}

/// [`camera`], with more of the peer's flags (`--ignore-probes`).
fn camera_with(
    name: &str,
    location: &str,
    ip: &str,
    mac: &str,
    auth: bool,
    extra: &[&str],
) -> Camera {
    let uuid = uuid_for(name);
    let port = akri_testing::free_port().unwrap();
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--uuid",
        &uuid,
        "--scope",
        &format!("onvif://www.onvif.org/name/{name}"),
        "--scope",
        &format!("onvif://www.onvif.org/location/{location}"),
        "--ip",
        ip,
        "--mac",
        mac,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    if auth {
        args.extend([
            "--username".into(),
            "admin".into(),
            "--password".into(),
            PASSWORD.into(),
        ]);
    }
    let peer = Peer::start(name, "onvif_camera.py", &args).expect("the camera starts");
    Camera { uuid, port, peer }
}

fn uuid_for(name: &str) -> String {
    // Unique per run, so that cameras of other runs never match.
    let unique = akri_testing::ControlPlane::unique_name(name);
    let digits: String = unique.bytes().map(|b| format!("{:02x}", b)).collect();
    let hex = format!("{digits:0<32}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn service_url(camera: &Camera) -> String {
    let host = akri_testing::peers::multicast_source();
    format!("http://{host}:{}/onvif/device_service", camera.port)
}

async fn next(stream: &mut tonic::Streaming<proto::DiscoverResponse>) -> Vec<proto::Device> {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("a device list within 30 s")
        .expect("the stream carries on")
        .expect("the stream is open")
        .devices
}

/// The devices, by uuid, once the list has `count` of them.
async fn devices(
    stream: &mut tonic::Streaming<proto::DiscoverResponse>,
    count: usize,
) -> HashMap<String, HashMap<String, String>> {
    loop {
        let devices = next(stream).await;
        if devices.len() == count {
            return devices
                .into_iter()
                .map(|d| (d.properties["ONVIF_DEVICE_UUID"].clone(), d.properties))
                .collect();
        }
    }
}

fn serve(dir: &Path) -> Served {
    let onvif = Onvif {
        rescan: Duration::from_millis(500),
        query_timeout: Duration::from_secs(3),
        ..Onvif::default()
    };
    Served::start(onvif, &dir.join("onvif.sock")).unwrap()
}

/// Details asking for `cameras` only, plus `extra` filters.
fn details(cameras: &[&Camera], extra: &str) -> String {
    let uuids: Vec<&str> = cameras.iter().map(|c| c.uuid.as_str()).collect();
    format!(
        "uuids: {{action: Include, items: [{}]}}\ndiscoveryTimeoutSeconds: 1\n{extra}",
        uuids.join(", ")
    )
}

#[tokio::test]
async fn cameras_are_found_asked_with_their_credentials_and_filtered() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("onvif.sock");
    let dock = camera("dock", "dock", "10.0.0.11", "00:11:22:33:44:01", true);
    let mut lobby = camera("lobby", "lobby", "10.0.0.12", "00:11:22:33:44:02", false);
    let both = [&dock, &lobby];
    let username = format!("username_{}", dock.uuid);
    let password = format!("password_{}", dock.uuid);
    let credentials = [
        (username.as_str(), b"admin".as_slice()),
        (password.as_str(), PASSWORD.as_bytes()),
    ];

    // With the dock camera's credential: both cameras, with what their device services say.
    let mut stream = discover(&socket, &details(&both, ""), &credentials)
        .await
        .unwrap();
    let found = devices(&mut stream, 2).await;
    let d = &found[&dock.uuid];
    assert_eq!(d["ONVIF_DEVICE_SERVICE_URL"], service_url(&dock));
    assert_eq!(d["ONVIF_DEVICE_IP_ADDRESS"], "10.0.0.11");
    assert_eq!(d["ONVIF_DEVICE_MAC_ADDRESS"], "00:11:22:33:44:01");
    assert_eq!(
        d["ONVIF_STREAM_URI"],
        format!("rtsp://10.0.0.11:554/{}/main", dock.uuid)
    );
    assert_eq!(found[&lobby.uuid]["ONVIF_DEVICE_IP_ADDRESS"], "10.0.0.12");
    for properties in found.values() {
        assert!(
            properties.values().all(|v| !v.contains(PASSWORD)),
            "{properties:?}"
        );
    }
    drop(stream);

    // Without it, or with a wrong one: the dock camera refuses, and is found without them.
    let wrong: [(&str, &[u8]); 2] = [(&username, b"admin"), (&password, b"wrong")];
    for properties in [&[][..], &wrong[..]] {
        let mut stream = discover(&socket, &details(&both, ""), properties)
            .await
            .unwrap();
        let found = devices(&mut stream, 2).await;
        assert!(
            !found[&dock.uuid].contains_key("ONVIF_DEVICE_IP_ADDRESS"),
            "{found:?}"
        );
        assert!(!found[&dock.uuid].contains_key("ONVIF_STREAM_URI"));
        assert_eq!(found[&lobby.uuid]["ONVIF_DEVICE_IP_ADDRESS"], "10.0.0.12");
    }

    // Filters: scopes, IP and MAC addresses.
    for (extra, expected) in [
        (
            "scopes: {items: ['onvif://www.onvif.org/location/dock']}",
            &dock,
        ),
        (
            "scopes: {action: Exclude, items: ['onvif://www.onvif.org/location/dock']}",
            &lobby,
        ),
        ("ipAddresses: {action: Exclude, items: [10.0.0.11]}", &lobby),
        ("macAddresses: {items: ['00:11:22:33:44:01']}", &dock),
    ] {
        let mut stream = discover(&socket, &details(&both, extra), &credentials)
            .await
            .unwrap();
        let found = devices(&mut stream, 1).await;
        assert!(found.contains_key(&expected.uuid), "{extra}: {found:?}");
    }

    // A camera that goes away is removed.
    let mut stream = discover(&socket, &details(&both, ""), &credentials)
        .await
        .unwrap();
    devices(&mut stream, 2).await;
    lobby.peer.kill();
    let found = devices(&mut stream, 1).await;
    assert!(found.contains_key(&dock.uuid));
}

/// A camera that answers no probe (WS-Discovery off, as on many cameras) is found only where
/// the configuration lists it, asked with its credential as a found one, and goes when its
/// device service stops answering; without a uuid in the list, its uuid is derived from the URL.
#[tokio::test]
async fn a_camera_that_ignores_probes_is_found_where_it_is_listed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("onvif.sock");
    let attic = camera_with(
        "attic",
        "attic",
        "10.0.0.31",
        "00:11:22:33:44:31",
        true,
        &["--ignore-probes"],
    );
    let url = service_url(&attic);
    let username = format!("username_{}", attic.uuid);
    let password = format!("password_{}", attic.uuid);
    let credentials = [
        (username.as_str(), b"admin".as_slice()),
        (password.as_str(), PASSWORD.as_bytes()),
    ];

    // Not listed: the probe finds nothing of it (the first list comes after a whole probe
    // window, in which a camera that answers is found, as the test above shows).
    let mut stream = discover(&socket, &details(&[&attic], ""), &credentials)
        .await
        .unwrap();
    assert!(
        next(&mut stream).await.is_empty(),
        "a camera that ignores probes"
    );
    drop(stream);

    // Listed with its uuid: found, asked with its credential.
    let listed = format!(
        "cameras:\n- deviceServiceUrl: {url}\n  uuid: urn:uuid:{}",
        attic.uuid.to_uppercase()
    );
    let mut stream = discover(&socket, &details(&[&attic], &listed), &credentials)
        .await
        .unwrap();
    let found = devices(&mut stream, 1).await;
    let d = &found[&attic.uuid];
    assert_eq!(d["ONVIF_DEVICE_SERVICE_URL"], url);
    assert_eq!(d["ONVIF_DEVICE_IP_ADDRESS"], "10.0.0.31");
    assert_eq!(d["ONVIF_DEVICE_MAC_ADDRESS"], "00:11:22:33:44:31");
    assert_eq!(
        d["ONVIF_STREAM_URI"],
        format!("rtsp://10.0.0.31:554/{}/main", attic.uuid)
    );
    drop(stream);

    // Listed without a uuid: one derived from its URL names it and its credential.
    let derived = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, url.as_bytes()).to_string();
    let (username, password) = (format!("username_{derived}"), format!("password_{derived}"));
    let credentials = [
        (username.as_str(), b"admin".as_slice()),
        (password.as_str(), PASSWORD.as_bytes()),
    ];
    let listed = format!("cameras:\n- deviceServiceUrl: {url}");
    let mut stream = discover(&socket, &details(&[&attic], &listed), &credentials)
        .await
        .unwrap();
    let found = devices(&mut stream, 1).await;
    assert_eq!(found[&derived]["ONVIF_DEVICE_IP_ADDRESS"], "10.0.0.31");

    // Its device service gone: so is the device.
    let mut attic = attic;
    attic.peer.kill();
    assert!(devices(&mut stream, 0).await.is_empty());
}

#[tokio::test]
async fn bad_details_fail_the_call_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let _served = serve(dir.path());
    let socket = dir.path().join("onvif.sock");
    for (details, says) in [
        ("discoveryTimeoutSeconds: 0", "between 1 and 60"),
        ("ipAdresses: {items: [10.0.0.1]}", "ipAdresses"),
        ("scopes: {action: Maybe}", "Maybe"),
        (
            "cameras: [{deviceServiceUrl: 'http://camera.local/onvif/device_service'}]",
            "at an IP address",
        ),
    ] {
        let status = discover(&socket, details, &[]).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{details}");
        assert!(
            status.message().starts_with("onvif discovery details: ")
                && status.message().contains(says),
            "{details}: {}",
            status.message()
        );
    }
}

/// The standalone binary beside the kubelet-plugin's agent, as a node runs it: garbage details
/// and the handler killed mid-stream each show in the configuration's status for this node,
/// without touching another configuration, and clear once put right.
#[tokio::test]
async fn bad_details_and_a_killed_handler_show_in_the_status_and_clear() {
    use akri_kubelet_plugin::agent::{self, AgentConfig};
    use akri_testing::discovery::AgentCluster;
    use akri_testing::eventually_within;

    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = AgentCluster::start(&akri_api::crds::all()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::embedded(&cluster.node, &cluster.namespace, dir.path());
    let handlers_dir = config.discovery_socket.parent().unwrap().to_path_buf();
    let _agent = agent::start(cluster.client.clone(), config)
        .await
        .expect("agent starts");
    let start_handler = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-onvif-discovery-handler"))
            .arg("--handlers-dir")
            .arg(&handlers_dir)
            .args(["--rescan-seconds", "1"])
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let handler = start_handler();
    let gate = camera("gate", "gate", "10.0.0.21", "00:11:22:33:44:21", false);

    let (cameras, garbage) = ("cameras", "garbage");
    cluster
        .apply_configuration(cameras, "onvif", &details(&[&gate], ""))
        .await;
    cluster
        .apply_configuration(garbage, "onvif", "uuids: [not, a, filter]")
        .await;
    let error_of = async |name: &str| cluster.discovery_error(name).await;
    let found = async |name: &str| {
        cluster
            .instance_properties(name)
            .await
            .iter()
            .any(|p| {
                p.get("ONVIF_DEVICE_UUID") == Some(&gate.uuid)
                    && p.get("ONVIF_DEVICE_IP_ADDRESS").map(String::as_str) == Some("10.0.0.21")
            })
            .then_some(())
    };
    eventually_within(
        "the camera's Instance",
        Duration::from_secs(60),
        async || found(cameras).await,
    )
    .await;
    let message = cluster.error_appears(garbage).await;
    assert!(
        message.contains("onvif discovery details"),
        "says the details are wrong: {message}"
    );
    assert_eq!(
        error_of(cameras).await,
        None,
        "the other configuration is fine"
    );

    // Killed mid-stream: the status names the handler; started again, all is as before.
    let _handler = cluster
        .kill_and_restart_handler(cameras, "onvif", handler, start_handler)
        .await;
    eventually_within("the Instance back", Duration::from_secs(30), async || {
        found(cameras).await
    })
    .await;

    // The garbage details put right: that configuration finds the camera too, and its error
    // clears.
    cluster
        .apply_configuration(garbage, "onvif", &details(&[&gate], ""))
        .await;
    cluster.error_clears(garbage).await;
    eventually_within(
        "the fixed configuration's Instance",
        Duration::from_secs(30),
        async || found(garbage).await,
    )
    .await;
}

/// The test camera is no stricter than real ones, or a handler that works with cameras could
/// find nothing against it: it answers a probe whose type's prefix is not declared (Akri's
/// ONVIF handler sends `netwsdl:NetworkVideoTransmitter` so, and cameras match it by its local
/// name), and `GetSystemDateAndTime` without credentials (what clients ask first, to compute
/// their digests against the camera's clock).
#[tokio::test]
async fn the_test_camera_answers_what_real_cameras_answer() {
    let _one = ONE_AT_A_TIME.lock().await;
    let camera = camera("lenient", "yard", "10.0.0.13", "00:11:22:33:44:03", true);

    let probe = format!(
        r#"<?xml version="1.0" encoding="utf-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:w="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery"><s:Header><w:MessageID>uuid:{}</w:MessageID><w:To>urn:schemas-xmlsoap-org:ws:2005:04:discovery</w:To><w:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/Probe</w:Action></s:Header><s:Body><d:Probe><d:Types>netwsdl:NetworkVideoTransmitter</d:Types></d:Probe></s:Body></s:Envelope>"#,
        uuid::Uuid::new_v4()
    );
    let socket = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
    let answered = async {
        let mut buffer = vec![0; 65536];
        loop {
            socket
                .send_to(probe.as_bytes(), "239.255.255.250:3702")
                .await
                .unwrap();
            let deadline = tokio::time::sleep(Duration::from_secs(1));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    received = socket.recv_from(&mut buffer) => {
                        let (n, _) = received.unwrap();
                        let answer = String::from_utf8_lossy(&buffer[..n]).to_string();
                        if answer.contains(&camera.uuid) {
                            return answer;
                        }
                    }
                    _ = &mut deadline => break,
                }
            }
        }
    };
    let answer = tokio::time::timeout(Duration::from_secs(20), answered)
        .await
        .expect("the camera answers a probe with an undeclared type prefix within 20 s");
    assert!(answer.contains("ProbeMatch"), "{answer}");

    let request = r#"<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="http://www.onvif.org/ver10/device/wsdl"><s:Body><tds:GetSystemDateAndTime/></s:Body></s:Envelope>"#;
    let host = akri_testing::peers::multicast_source();
    let mut stream = tokio::net::TcpStream::connect((host, camera.port))
        .await
        .unwrap();
    let head = format!(
        "POST /onvif/device_service HTTP/1.1\r\nHost: {host}:{}\r\nContent-Type: application/soap+xml; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        camera.port,
        request.len()
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await
    .expect("an answer within 10 s")
    .unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    assert!(
        response.contains("GetSystemDateAndTimeResponse"),
        "{response}"
    );
    assert!(response.contains("<tt:Year>"), "{response}");
}
