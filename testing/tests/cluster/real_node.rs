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

/// The child process of [`a_killed_runs_node_is_swept_by_the_next_start`]: a real node with a
/// running pod, then it waits to be killed.
#[tokio::test]
#[ignore = "run only as the child process of a_killed_runs_node_is_swept_by_the_next_start"]
async fn child_with_a_running_pod() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let node = RealNode::start(cp, "doomed").await.unwrap();
    let ns = cp.create_namespace("doomed").await.unwrap();
    let pods = Api::<Pod>::namespaced(cp.client().await.unwrap(), &ns);
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "doomed" },
        "spec": {
            "nodeName": "doomed",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": node.busybox_image().unwrap(),
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    }));
    pods.create(&PostParams::default(), &pod).await.unwrap();
    node.eventually("the pod running", Duration::from_secs(60), async || {
        let pod = pods.get("doomed").await.ok()?;
        (pod.status?.phase? == "Running").then_some(())
    })
    .await;
    #[allow(clippy::print_stdout)] // the parent reads this line
    {
        println!("READY {}", node.dir().display());
    }
    std::future::pending::<()>().await;
}

/// Test `name` of this module as the test binary names it, for `--exact` (a child that ran
/// no test would exit 0 and pass).
fn test_of_this_module(name: &str) -> String {
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_, module)| module);
    format!("{module}::{name}")
}

#[tokio::test]
async fn a_killed_runs_node_is_swept_by_the_next_start() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &test_of_this_module("child_with_a_running_pod"),
            "--ignored",
            "--nocapture",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let dir = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap() > 0 {
            if let Some(dir) = line.trim().strip_prefix("READY ") {
                return std::path::PathBuf::from(dir);
            }
            line.clear();
        }
        panic!("the child ended without a running pod");
    })
    .await
    .unwrap();
    let bridge = format!("akn{}-", child.id());
    let links = || {
        let out = std::process::Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(links().contains(&bridge), "the child's node has its bridge");
    child.kill().unwrap();
    child.wait().unwrap();
    let root = dir.file_name().unwrap().to_string_lossy().into_owned();
    let left = |dir: &std::path::Path| {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .filter(|cmd| String::from_utf8_lossy(cmd).contains(&*dir.to_string_lossy()))
            .count()
    };
    assert!(
        left(&dir) > 0,
        "the killed run's shims and containers outlive it"
    );
    assert!(
        std::path::Path::new("/sys/fs/cgroup/pids")
            .join(&root)
            .exists()
    );

    let cp = ControlPlane::shared().await.unwrap();
    let _node = RealNode::start(cp, &ControlPlane::unique_name("sweeper"))
        .await
        .unwrap();
    assert_eq!(
        left(&dir),
        0,
        "processes of the killed run's node still run"
    );
    assert!(!dir.exists(), "its directory is left");
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        assert!(
            !hierarchy.path().join(&root).exists(),
            "its cgroup is left in {hierarchy:?}"
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*dir.to_string_lossy()),
        "its mounts are left"
    );
}

/// The child process of [`a_nearly_full_disk_neither_marks_the_node_nor_refuses_pods`], run
/// with `TMPDIR` on the nearly full filesystem: the control plane, the node's directory,
/// containerd's images and the pods' logs all live there.
#[tokio::test]
#[ignore = "run only as the child process of a_nearly_full_disk_neither_marks_the_node_nor_refuses_pods"]
async fn child_on_a_nearly_full_disk() {
    use k8s_openapi::api::core::v1::Node;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let node = RealNode::start(cp, "full-disk").await.unwrap();
    let client = cp.client().await.unwrap();
    let nodes = Api::<Node>::all(client.clone());
    // The kubelet's eviction manager looks every 10 s; give it two looks before the pod.
    let watched_until = std::time::Instant::now() + Duration::from_secs(25);
    while std::time::Instant::now() < watched_until {
        let status = nodes.get("full-disk").await.unwrap().status.unwrap();
        let pressure = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DiskPressure" && c.status == "True");
        assert!(pressure.is_none(), "the node reports {pressure:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let ns = cp.create_namespace("full-disk").await.unwrap();
    let pods = Api::<Pod>::namespaced(client, &ns);
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "late" },
        "spec": {
            "nodeName": "full-disk",
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": node.busybox_image().unwrap(),
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    }));
    pods.create(&PostParams::default(), &pod).await.unwrap();
    node.eventually(
        "the late pod running",
        Duration::from_secs(60),
        async || {
            let pod = pods.get("late").await.ok()?;
            (pod.status?.phase? == "Running").then_some(())
        },
    )
    .await;
}

/// CI machines share their disk with the build and have run with under 1% of it free. The
/// kubelet's default eviction thresholds (and any low ones) then report DiskPressure and
/// refuse every new pod; test nodes must not: they evict nothing and garbage-collect no
/// images, whatever the disk. A sparse 30 GiB ext4 filesystem, filled to 250 MiB free
/// (below 1%), stands in for such a disk without taking the space.
#[tokio::test]
async fn a_nearly_full_disk_neither_marks_the_node_nor_refuses_pods() {
    let work = tempfile::tempdir().unwrap();
    let disk = NearlyFullDisk::create(work.path(), 30 << 10, 250);
    let output = tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &test_of_this_module("child_on_a_nearly_full_disk"),
                "--ignored",
                "--nocapture",
            ])
            .env("TMPDIR", &disk.mount)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        drop(disk);
        output
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the child failed: {}",
        output.status
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "the child ran no test:\n{stdout}"
    );
}

/// A loop-mounted ext4 filesystem on a sparse file, filled with one preallocated (not
/// written) file, so that it reports little free space while the file beneath it stays small.
struct NearlyFullDisk {
    mount: std::path::PathBuf,
}

impl NearlyFullDisk {
    fn create(dir: &std::path::Path, size_mib: u64, free_mib: u64) -> NearlyFullDisk {
        let run = |program: &str, args: &[&str]| {
            let status = std::process::Command::new(program)
                .args(args)
                .status()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(status.success(), "{program} {args:?}: {status}");
        };
        let image = dir.join("disk.img");
        let mount = dir.join("mnt");
        std::fs::create_dir(&mount).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        let image = image.to_str().unwrap();
        run("mkfs.ext4", &["-q", "-F", "-m", "0", image]);
        run("mount", &["-o", "loop", image, mount.to_str().unwrap()]);
        let disk = NearlyFullDisk { mount };
        let available = free_space_mib(&disk.mount);
        let fill = disk.mount.join("fill");
        let fill_mib = (available - free_mib).to_string() + "M";
        run("fallocate", &["-l", &fill_mib, fill.to_str().unwrap()]);
        disk
    }
}

/// Free MiB of the filesystem at `path`, as df reports it.
fn free_space_mib(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-BM", "--output=avail"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().trim_end_matches('M').parse().ok())
        .expect("df prints the free space")
}

impl Drop for NearlyFullDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .status();
    }
}
