//! The API server gone, refusing, or silently dead.

use super::support::{
    cpu_seconds, echo_config, eventually, node_with_peer, pool_size, publication,
    spawn_plugin_through, through_proxy,
};
use akri_testing::ControlPlane;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use std::path::Path;
use std::time::Duration;

/// A minute without the API server, and a minute of 403s: neither costs a device, and
/// neither makes the plugin spin (its CPU and log lines per second are printed).
#[tokio::test]
async fn an_api_server_outage_or_403s_cost_nothing_and_do_not_spin() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let (down_node, ns, down_peer, down_dir) = node_with_peer("outage").await;
    let (denied_node, _, denied_peer, denied_dir) = node_with_peer("denied").await;

    // One plugin reaches the API server through a proxy that will go down; the other runs as
    // a user whose permissions will be taken away.
    let (proxy, down_kubeconfig) = through_proxy(cp, down_dir.path(), None).await;
    let user = format!("system:serviceaccount:akri:{denied_node}");
    let binding = ControlPlane::unique_name("akri-kubelet-plugin");
    akri_testing::rbac::grant_kubelet_plugin(&admin, &user, &binding, &ns)
        .await
        .unwrap();
    // Open watches are not authorised again: its connections are closed when its rights go,
    // so that every request after that meets the 403.
    let (denied_proxy, denied_kubeconfig) = through_proxy(cp, denied_dir.path(), Some(&user)).await;
    let mut down_plugin = spawn_plugin_through(
        &down_kubeconfig,
        &down_peer,
        &down_node,
        &ns,
        down_dir.path(),
        &[],
    );
    let mut denied_plugin = spawn_plugin_through(
        &denied_kubeconfig,
        &denied_peer,
        &denied_node,
        &ns,
        denied_dir.path(),
        &[],
    );

    let config = echo_config(&admin, "outage", "o0").await;
    // Only this configuration's devices: other tests' configurations come and go meanwhile.
    let down_device = akri_devices::instance_name(&config, "o0", false, &down_node);
    let denied_device = akri_devices::instance_name(&config, "o0", false, &denied_node);
    let published = async |node: &str, device: &str| {
        pool_size(&admin, node, &config).await == 1
            && publication(&admin, node, &ns)
                .await
                .1
                .iter()
                .any(|i| i.0 == device)
    };
    eventually("both nodes publish", async || {
        (published(&down_node, &down_device).await && published(&denied_node, &denied_device).await)
            .then_some(())
    })
    .await;

    let log_lines = |dir: &Path| {
        std::fs::read_to_string(dir.join("plugin.log"))
            .unwrap()
            .lines()
            .count()
    };
    let (down_pid, denied_pid) = (down_plugin.id().unwrap(), denied_plugin.id().unwrap());
    let start = (
        cpu_seconds(down_pid),
        cpu_seconds(denied_pid),
        log_lines(down_dir.path()),
        log_lines(denied_dir.path()),
    );
    proxy.go_down();
    akri_testing::rbac::revoke_kubelet_plugin(&admin, &binding, &ns)
        .await
        .unwrap();
    denied_proxy.close_open_connections();
    let outage = Duration::from_secs(60);
    tokio::time::sleep(outage).await;
    let seconds = outage.as_secs_f64();
    let down_cpu = (cpu_seconds(down_pid) - start.0) / seconds;
    let denied_cpu = (cpu_seconds(denied_pid) - start.1) / seconds;
    let down_logs = (log_lines(down_dir.path()) - start.2) as f64 / seconds;
    let denied_logs = (log_lines(denied_dir.path()) - start.3) as f64 / seconds;
    eprintln!(
        "during a 60 s outage: CPU {:.2}% of a core, {down_logs:.2} log lines/s; during 60 s of 403s: CPU {:.2}%, {denied_logs:.2} log lines/s",
        down_cpu * 100.0,
        denied_cpu * 100.0
    );
    assert!(
        down_cpu < 0.05 && denied_cpu < 0.05,
        "no hot loop: {down_cpu} {denied_cpu}"
    );
    assert!(
        down_logs < 1.0 && denied_logs < 1.0,
        "no log flood: {down_logs} {denied_logs}"
    );
    assert!(
        down_plugin.try_wait().unwrap().is_none() && denied_plugin.try_wait().unwrap().is_none()
    );

    // Nothing was lost, and both come back by themselves.
    assert!(
        published(&down_node, &down_device).await,
        "the outage cost no device"
    );
    assert!(
        published(&denied_node, &denied_device).await,
        "the 403s cost no device"
    );
    proxy.resume();
    akri_testing::rbac::grant_kubelet_plugin(&admin, &user, &format!("{binding}-again"), &ns)
        .await
        .unwrap();
    // A change after the outage reaches both nodes' pools.
    std::fs::write(down_dir.path().join("availability.txt"), "OFFLINE").unwrap();
    std::fs::write(denied_dir.path().join("availability.txt"), "OFFLINE").unwrap();
    eventually("both nodes publish again after the outage", async || {
        let down: usize = publication(&admin, &down_node, &ns)
            .await
            .0
            .iter()
            .map(|s| s.3)
            .sum();
        let denied: usize = publication(&admin, &denied_node, &ns)
            .await
            .0
            .iter()
            .map(|s| s.3)
            .sum();
        (down == 0 && denied == 0).then_some(())
    })
    .await;
    down_plugin.kill().await.unwrap();
    denied_plugin.kill().await.unwrap();
}

/// A connection that dies silently (the API server's end gone without a word) must not hold
/// the node's publications: every call has a deadline, and the next one uses a new connection.
#[tokio::test]
async fn a_silently_dead_connection_does_not_stall_the_node() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_with_peer("blackhole").await;
    let (proxy, kubeconfig) = through_proxy(cp, dir.path(), None).await;
    let mut plugin = spawn_plugin_through(&kubeconfig, &peer, &node, &ns, dir.path(), &[]);
    let config = echo_config(&admin, "blackhole", "h0").await;
    let device = akri_devices::instance_name(&config, "h0", false, &node);
    let published = async || -> Vec<String> {
        Api::<ResourceSlice>::all(admin.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .map(|d| d.name)
            .collect()
    };
    eventually("published", async || {
        published().await.contains(&device).then_some(())
    })
    .await;

    proxy.black_hole_open_connections();
    std::fs::write(dir.path().join("availability.txt"), "OFFLINE").unwrap();
    // The first attempt waits out its deadline (20 s) on a dead connection; the resync (30 s)
    // retries on a new one. Without deadlines it waits for the client's read timeout (295 s).
    akri_testing::eventually_within(
        "the change published despite the dead connections",
        Duration::from_secs(90),
        async || (!published().await.contains(&device)).then_some(()),
    )
    .await;
    plugin.kill().await.unwrap();
}
