//! containerd for a real test node: its own root, state and sockets under the node's
//! directory, CDI specs read from the node's CDI directory, runc and the CNI plugins from
//! `hack/node-bins.sh`, and the pause and busybox images imported from archives.

use super::namespace::MountNamespace;
use crate::Error;
use crate::bins::NodeBins;
use crate::process::Component;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Paths of one containerd instance.
#[derive(Clone, Debug)]
pub(super) struct Containerd {
    pub config: PathBuf,
    pub socket: PathBuf,
    pub log_dir: PathBuf,
}

impl Containerd {
    /// Writes the configuration and the CNI network of a node rooted at `dir`.
    pub fn configure(
        bins: &NodeBins,
        dir: &Path,
        cdi_dir: &Path,
        bridge: &str,
        pod_subnet: &str,
    ) -> Result<Self, Error> {
        let socket = dir.join("containerd/containerd.sock");
        let cni_conf = dir.join("cni/net.d");
        for sub in [
            &cni_conf,
            &dir.join("cni/ipam"),
            &dir.join("containerd"),
            cdi_dir,
        ] {
            std::fs::create_dir_all(sub).map_err(Error::io(format!("create {}", sub.display())))?;
        }
        let pause = bins.image_name("pause")?;
        // The registry our images are pulled from (hack/registry.sh), plain HTTP on loopback:
        // said in its hosts.toml, as a user of such a registry tells containerd.
        let registries = dir.join("containerd/certs.d");
        let local = registries.join(crate::product::REGISTRY_HOST);
        std::fs::create_dir_all(&local).map_err(Error::io("create the registry's hosts dir"))?;
        std::fs::write(local.join("hosts.toml"), crate::product::hosts_toml()?)
            .map_err(Error::io("write the registry's hosts.toml"))?;
        let runc = bins.require("runc")?;
        // Config version 3 (containerd 2.x). CDI is always on in 2.x; only the spec directories
        // are ours. Network namespaces are mounted under the state directory so that the
        // teardown finds (and unmounts) them with everything else under the node's directory.
        // Snapshotters and plugins this node does not use are disabled to keep the log
        // readable. `restrict_oom_score_adj`: test machines like this one (a VM) may withhold
        // CAP_SYS_RESOURCE even from root, so runc cannot give the sandbox the -998 that
        // containerd asks for; restricted, no container gets a score below containerd's own.
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.nri.v1.nri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = "{socket}.debug"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '{registries}'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{pause}'
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['{cdi}']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{cni_bin}']
    conf_dir = '{cni_conf}'
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"#,
            root = dir.join("containerd/root").display(),
            state = dir.join("containerd/state").display(),
            socket = socket.display(),
            cdi = cdi_dir.display(),
            runc = runc.display(),
            cni_bin = bins.cni_dir().display(),
            cni_conf = cni_conf.display(),
            registries = registries.display(),
        );
        let config_path = dir.join("containerd/config.toml");
        std::fs::write(&config_path, config).map_err(Error::io("write containerd's config"))?;

        // The node's bridge (made by [`super::network`], carrying the node's own address),
        // the pods' default gateway on a subnet of this node's own, no masquerading: two test nodes on
        // one machine never collide on a route or an iptables rule, pods reach this machine
        // (the API server through the `kubernetes` Service) and nothing beyond it
        // ([`super::network::confine_pods`]).
        let network = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "akri-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isDefaultGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": dir.join("cni/ipam"),
                        "ranges": [[{ "subnet": pod_subnet }]],
                    },
                },
                { "type": "loopback" },
            ],
        });
        std::fs::write(cni_conf.join("10-akri-test.conflist"), network.to_string())
            .map_err(Error::io("write the CNI network"))?;
        Ok(Containerd {
            config: config_path,
            socket,
            log_dir: dir.to_path_buf(),
        })
    }

    /// Starts containerd in the node's mount namespace and waits until it answers.
    pub async fn start(
        &self,
        bins: &NodeBins,
        namespace: &MountNamespace,
    ) -> Result<Component, Error> {
        let path = format!(
            "{}:{}",
            bins.bin_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let (program, args) = namespace.command(
            &bins.require("containerd")?,
            &[format!("--config={}", self.config.display())],
        );
        let mut component = Component::start_with_env(
            "containerd",
            &program,
            &args,
            &[("PATH", path.as_ref())],
            &self.log_dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.ctr(bins, &["version"]).await.is_err() {
            component.check_running()?;
            if Instant::now() > deadline {
                return Err(component.not_ready(30));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(component)
    }

    /// Imports an OCI archive into the namespace the kubelet's pods live in.
    pub async fn import(&self, bins: &NodeBins, archive: &Path) -> Result<(), Error> {
        let archive = archive.display().to_string();
        self.ctr(bins, &["images", "import", &archive])
            .await
            .map(drop)
    }

    /// Runs `ctr` against this containerd in the `k8s.io` namespace; its stdout, or an error
    /// with its stderr.
    pub async fn ctr(&self, bins: &NodeBins, args: &[&str]) -> Result<String, Error> {
        let output = tokio::process::Command::new(bins.require("ctr")?)
            .arg(format!("--address={}", self.socket.display()))
            .arg("--namespace=k8s.io")
            .args(args)
            .output()
            .await
            .map_err(Error::io("run ctr"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error::Other(format!(
                "ctr {}: {}: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
}
