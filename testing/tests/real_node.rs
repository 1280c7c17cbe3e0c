//! The real node itself: containerd and the kubelet join the control plane, a pod runs from
//! the imported image, its output is readable through the API server, and dropping the node
//! leaves nothing running.

use akri_testing::{ControlPlane, RealNode, from_json};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use std::time::Duration;

#[tokio::test]
async fn a_pod_runs_on_the_real_node_and_nothing_outlives_it() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("real-node").await.unwrap();
    let node_name = ControlPlane::unique_name("real");
    let node = RealNode::start(cp, &node_name).await.unwrap();
    let dir = node.dir().to_path_buf();

    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "hello" },
        "spec": {
            "nodeName": node_name,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "hello",
                "image": node.busybox_image().unwrap(),
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo hello from $(hostname); sleep 3600"],
            }],
        },
    }));
    pods.create(&PostParams::default(), &pod).await.unwrap();
    node.eventually("the pod running", Duration::from_secs(60), async || {
        let pod = pods.get("hello").await.ok()?;
        (pod.status?.phase? == "Running").then_some(())
    })
    .await;
    node.eventually(
        "the container's output",
        Duration::from_secs(20),
        async || {
            let logs = pods.logs("hello", &LogParams::default()).await.ok()?;
            logs.contains("hello from hello").then_some(())
        },
    )
    .await;

    drop(node);
    let procs = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmd| String::from_utf8_lossy(cmd).contains(&*dir.to_string_lossy()))
        .count();
    assert_eq!(procs, 0, "processes of the dropped node still run");
    assert!(!dir.exists(), "the node's directory is left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*dir.to_string_lossy()), "mounts are left");
}
