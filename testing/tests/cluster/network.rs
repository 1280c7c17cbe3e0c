//! The network helpers on a real kube-apiserver: a stalled proxy holds requests until it
//! resumes, and slow LISTs are slow while everything else is not.

use akri_testing::{ControlPlane, SlowLists, TcpProxy};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_stalled_proxy_holds_requests_until_it_resumes() {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane starts");
    let config = cp.client_config().await.unwrap();
    let proxy = TcpProxy::start(cp.api_server_address()).await.unwrap();
    let client = kube::Client::try_from(proxy.client_config(&config).unwrap()).unwrap();
    let namespaces = Api::<Namespace>::all(client);
    namespaces.get("default").await.expect("through the proxy");

    proxy.stall();
    let held = tokio::spawn({
        let namespaces = namespaces.clone();
        async move { namespaces.get("kube-system").await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !held.is_finished(),
        "a request through a stalled proxy waits"
    );
    proxy.resume();
    tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("answered once resumed")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn slow_lists_delay_lists_only() {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane starts");
    let delay = Duration::from_secs(2);
    let client = SlowLists::new()
        .delay("namespaces", delay)
        .client(cp.client_config().await.unwrap())
        .unwrap();
    let namespaces = Api::<Namespace>::all(client);
    let start = Instant::now();
    namespaces.get("default").await.unwrap();
    assert!(start.elapsed() < delay, "a single read is not delayed");
    let start = Instant::now();
    namespaces.list(&Default::default()).await.unwrap();
    assert!(start.elapsed() >= delay, "a LIST is");
}
