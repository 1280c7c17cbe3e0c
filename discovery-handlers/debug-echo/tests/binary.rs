//! The standalone binary with the kubelet-plugin's registration socket and discovery client:
//! it registers (waiting for an agent that starts after it), serves discovery, and stops on
//! SIGTERM leaving no socket behind.

use akri_kubelet_plugin::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Endpoint, Registry, StreamConfig,
};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

#[tokio::test]
async fn registers_with_a_late_agent_serves_discovery_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut handler =
        tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-debug-echo-discovery-handler"))
            .arg("--handlers-dir")
            .arg(dir.path())
            .arg("--availability-file")
            .arg(dir.path().join("availability.txt"))
            // Akri's DaemonSet setting, read as Akri's handler reads it.
            .env("DEBUG_ECHO_INSTANCES_SHARED", "true")
            // Its health endpoints on a port the OS picks, which its log says.
            .args(["--health-address", "127.0.0.1:0", "--log-json"])
            .env("RUST_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
    let mut log = tokio::io::BufReader::new(handler.stderr.take().unwrap()).lines();
    let health = loop {
        let line = (log.next_line().await.unwrap()).expect("it logs its health address");
        let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(address) = entry["fields"]["address"].as_str() {
            break address.parse::<std::net::SocketAddr>().unwrap();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
    // No agent yet: alive, not ready, and it says why.
    assert_eq!(
        akri_testing::http_get(health, "/healthz").await.unwrap().0,
        200
    );
    let (code, why) = akri_testing::eventually("a failed registration", async || {
        let (code, body) = akri_testing::http_get(health, "/readyz").await.ok()?;
        body.contains("agent-registration.sock")
            .then_some((code, body))
    })
    .await;
    assert_eq!(code, 503, "{why}");
    let scrape = async || {
        let (_, text) = akri_testing::http_get(health, "/metrics").await.unwrap();
        [("debug-echo", text)]
    };
    // What the chart's alert of unregistered handlers is about.
    let alert = akri_testing::monitoring::Alert::named("AkriDiscoveryHandlerNotRegistered")
        .pending(&scrape().await, &[&[("pod", "debug-echo")]]);
    assert!(
        why.starts_with("not ready: not registered with the node agent: "),
        "{why}"
    );
    // The agent comes after the handler.
    let registry = Registry::serve(
        &dir.path().join("agent-registration.sock"),
        &dir.path().join("handlers.json"),
    )
    .unwrap();
    let socket = dir.path().join("debugEcho.sock");
    let registered = akri_testing::eventually_within(
        "the handler registered",
        Duration::from_secs(15),
        async || registry.handlers().get("debugEcho").cloned(),
    )
    .await;
    assert_eq!(registered.endpoint, Endpoint::Uds(socket.clone()));
    akri_testing::eventually("ready once registered", async || {
        let (code, _) = akri_testing::http_get(health, "/readyz").await.ok()?;
        (code == 200).then_some(())
    })
    .await;
    let (_, metrics) = akri_testing::http_get(health, "/metrics").await.unwrap();
    // The failed registration counted (the series is there from the start, at 0).
    let failed = (metrics.lines())
        .find_map(|l| {
            l.strip_prefix("akri_discovery_handler_registrations_total{result=\"error\"} ")
        })
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        metrics.contains("\nakri_discovery_handler_registered 1\n") && failed >= Some(1),
        "{metrics}"
    );
    assert!(registered.shared, "DEBUG_ECHO_INSTANCES_SHARED=true");
    (alert.silent(&scrape().await)).check();

    let request = DiscoveryRequest {
        details: "descriptions: [foo0, foo1]".into(),
        ..Default::default()
    };
    let mut stream = DiscoveryStream::start(registered, request, StreamConfig::default());
    match tokio::time::timeout(Duration::from_secs(10), stream.next_event()).await {
        Ok(Some(DiscoveryEvent::Devices(devices))) => {
            let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
            assert_eq!(ids, ["foo0", "foo1"]);
        }
        other => panic!("expected a device list, got {other:?}"),
    }
    // Details it cannot use: refused, and counted as such.
    let refused = akri_discovery_handler::client::discover(&socket, "descriptions: 7", &[]).await;
    assert!(refused.is_err(), "garbage details are refused");
    // Its discovery in its metrics: the call, the open stream, its two devices, the list.
    let value = |metrics: &str, series: &str| {
        (metrics.lines())
            .find_map(|l| l.strip_prefix(&format!("{series} ")))
            .and_then(|n| n.parse::<i64>().ok())
    };
    let metrics = akri_testing::eventually("the discovery in the metrics", async || {
        let (_, metrics) = akri_testing::http_get(health, "/metrics").await.ok()?;
        (value(&metrics, "akri_discovery_handler_devices") == Some(2)).then_some(metrics)
    })
    .await;
    for (series, expected) in [
        (
            "akri_discovery_handler_discover_calls_total{result=\"ok\"}",
            1,
        ),
        (
            "akri_discovery_handler_discover_calls_total{result=\"refused\"}",
            1,
        ),
        ("akri_discovery_handler_streams", 1),
        ("akri_discovery_handler_device_lists_total", 1),
    ] {
        assert_eq!(
            value(&metrics, series),
            Some(expected),
            "{series}:\n{metrics}"
        );
    }

    let pid = handler.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(10), handler.wait())
        .await
        .expect("it stops within 10 s")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(!socket.exists(), "its socket is removed");
}
