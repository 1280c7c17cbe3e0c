//! etcd + kube-apiserver (+ kube-scheduler + kube-controller-manager) as processes.

use crate::bins::BinDir;
use crate::certs::Certs;
use crate::process::Component;
use crate::services::{ApiServerAddress, KubeProxy, SERVICE_RANGE};
use crate::{Error, free_port};
use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// What to run besides etcd and kube-apiserver, and with which gates.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneOptions {
    /// Run kube-scheduler (allocation of ResourceClaims happens there).
    pub scheduler: bool,
    /// Run kube-controller-manager (ResourceClaims from templates, garbage collection,
    /// namespaces, service accounts; never the node-lifecycle controller, which would taint
    /// our simulated nodes as unreachable).
    pub controller_manager: bool,
    /// Feature gates on top of the defaults (every beta `DRA*` gate of the binary is on).
    pub feature_gates: BTreeMap<String, bool>,
    /// Gates set only where the binaries know them (a gate of a newer release than some the
    /// suites run on); [`ControlPlane::feature_gates`] says whether they were.
    pub feature_gates_if_known: BTreeMap<String, bool>,
    /// Extra `--runtime-config` entries for kube-apiserver, e.g. `resource.k8s.io/v1alpha3=true`.
    pub runtime_config: Vec<String>,
    /// CRDs installed before the scheduler and controller-manager start, as on a cluster whose
    /// CRDs came first: the garbage collector then watches their objects from its start
    /// (it discovers resources added later only on its periodic resync, up to a minute late).
    pub crds: Vec<CustomResourceDefinition>,
    /// The `kubernetes` Service for pods on real nodes ([`crate::services`]): the API server
    /// on an address pods reach, and kube-proxy. Needs root; one such control plane at a time
    /// on a machine.
    pub services: bool,
}

impl ControlPlaneOptions {
    /// Everything: etcd, kube-apiserver, kube-scheduler and kube-controller-manager.
    pub fn full() -> Self {
        ControlPlaneOptions {
            scheduler: true,
            controller_manager: true,
            ..Default::default()
        }
    }

    /// Everything, and the `kubernetes` Service for pods ([`services`](Self::services)): what
    /// the chart's components need to run as pods on real nodes.
    pub fn with_services() -> Self {
        ControlPlaneOptions {
            services: true,
            ..Self::full()
        }
    }

    /// Adds a feature gate (alpha gates are set per test this way).
    pub fn feature_gate(mut self, name: &str, enabled: bool) -> Self {
        self.feature_gates.insert(name.to_string(), enabled);
        self
    }

    /// Adds a feature gate where the binaries know it, and none where they do not (an older
    /// release's): a test of a newer feature then tests what happens without it.
    pub fn feature_gate_if_known(mut self, name: &str, enabled: bool) -> Self {
        self.feature_gates_if_known
            .insert(name.to_string(), enabled);
        self
    }
}

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    bins: BinDir,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    kubeconfig_yaml: Kubeconfig,
    feature_gates: String,
    /// Every gate `kube-apiserver --help` lists, with its default.
    gate_defaults: BTreeMap<String, bool>,
    serves_dra: bool,
    // Field order is drop order: clients of the API server go first, etcd last.
    _kube_proxy: Option<KubeProxy>,
    controller_manager: Option<Component>,
    scheduler: Option<Component>,
    apiserver: Component,
    etcd: Component,
    _api_server_address: Option<ApiServerAddress>,
    started_in: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir.path())
            .field("version", &self.bins.version())
            .finish()
    }
}

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The API server's audit log, in its directory ([`ControlPlane::audited_writes`]).
const AUDIT_LOG: &str = "audit.log";

/// Writes at Metadata level (who, what, the answer), nothing else: reads and watches are not
/// logged.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

/// `config` with its requests carrying user agent `agent`
/// ([`ControlPlane::audited_writes`] tells clients apart by it).
pub fn with_user_agent(mut config: kube::Config, agent: &str) -> kube::Config {
    let agent = http::HeaderValue::from_str(agent).expect("a user agent is a header value");
    config.headers.push((http::header::USER_AGENT, agent));
    config
}

/// One write the API server audited ([`ControlPlane::audited_writes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedWrite {
    pub user: String,
    pub user_agent: String,
    /// `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// The resource (`leases`, `deviceclasses`, `discoveryconfigurations/status`, ...).
    pub resource: String,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
    /// The API server's answer (200, 201, 409, ...).
    pub code: i64,
}

impl ControlPlane {
    /// One full control plane per test binary, started on first use. Tests that share it keep
    /// to their own namespaces and node names ([`unique_name`](Self::unique_name) helps).
    pub async fn shared() -> Result<&'static ControlPlane, Error> {
        static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| ControlPlane::start(ControlPlaneOptions::full()))
            .await
    }

    /// Only etcd + kube-apiserver, one per test binary: enough for API and validation tests.
    pub async fn shared_api_server() -> Result<&'static ControlPlane, Error> {
        static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| ControlPlane::start(ControlPlaneOptions::default()))
            .await
    }

    /// Starts a control plane of its own.
    pub async fn start(options: ControlPlaneOptions) -> Result<ControlPlane, Error> {
        let started = Instant::now();
        let bins = BinDir::from_env()?;
        sweep_orphans();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(Error::io("create the control plane directory"))?;
        std::fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())
            .map_err(Error::io("record the control plane's owner"))?;
        let api_server_address = if options.services {
            Some(ApiServerAddress::create()?)
        } else {
            None
        };
        let host = api_server_address
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |a| a.address);
        let certs = Certs::generate(dir.path(), host)?;
        let (feature_gates, dra, gate_defaults) = feature_gates(&bins, &options)?;

        let etcd_port = free_port()?;
        let mut etcd = Component::start(
            "etcd",
            &bins.require("etcd")?,
            &[
                format!("--data-dir={}", dir.path().join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{}", free_port()?),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            dir.path(),
        )?;
        etcd.check_running()?;

        // Every write the API server takes, audited: an oracle of what each client wrote that
        // owes nothing to the client (`ControlPlane::audited_writes`).
        let audit_policy = dir.path().join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY).map_err(Error::io("write the audit policy"))?;
        let apiserver_port = free_port()?;
        // The older DRA API beside v1, for the tests of its conversions; none where DRA is off.
        let mut runtime_config = match dra {
            true => vec!["resource.k8s.io/v1beta2=true".to_string()],
            false => Vec::new(),
        };
        runtime_config.extend(options.runtime_config.iter().cloned());
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--bind-address={host}"),
            format!("--advertise-address={host}"),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", dir.path().display()),
            format!("--tls-cert-file={}", certs.serving_cert.display()),
            format!("--tls-private-key-file={}", certs.serving_key.display()),
            format!("--client-ca-file={}", certs.ca_cert.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", certs.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                certs.sa_key.display()
            ),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--authorization-mode=Node,RBAC".into(),
            "--allow-privileged=true".into(),
            // A real test node's kubelet serves on loopback and reports it as its
            // InternalIP; its Hostname (the node name) resolves nowhere. Logs and exec
            // reach it by the address.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--enable-priority-and-fairness=false".into(),
            format!("--feature-gates={feature_gates}"),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", dir.path().join(AUDIT_LOG).display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--v=1".into(),
        ];
        if !runtime_config.is_empty() {
            args.push(format!("--runtime-config={}", runtime_config.join(",")));
        }
        if host.is_loopback() {
            // Without the `kubernetes` Service (`options.services`) nothing needs its
            // endpoints, and from 1.37 the API server refuses to reconcile them to loopback.
            args.push("--endpoint-reconciler-type=none".into());
        }
        let mut apiserver = Component::start(
            "kube-apiserver",
            &bins.require("kube-apiserver")?,
            &args,
            dir.path(),
        )?;

        let server = format!("https://{host}:{apiserver_port}");
        let kubeconfig_text = kubeconfig_yaml(&server, &certs);
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, &kubeconfig_text).map_err(Error::io("write the kubeconfig"))?;
        let kubeconfig_yaml = Kubeconfig::from_yaml(&kubeconfig_text)
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let client = client_from(&kubeconfig_yaml).await?;
        wait_until("kube-apiserver", &mut apiserver, || async {
            let request = http_get("/readyz");
            matches!(client.request_text(request).await, Ok(body) if body.trim() == "ok")
        })
        .await?;
        etcd.check_running()?;
        install_crds(&client, &options.crds).await?;

        let mut scheduler = None;
        if options.scheduler {
            scheduler = Some(
                start_client_component(
                    "kube-scheduler",
                    &bins,
                    dir.path(),
                    &kubeconfig,
                    &feature_gates,
                    &[],
                )
                .await?,
            );
        }
        let mut controller_manager = None;
        if options.controller_manager {
            let extra = [
                // Never the node-lifecycle controller: it would taint our simulated nodes.
                "--controllers=*,-node-lifecycle-controller,-node-ipam-controller".to_string(),
                format!(
                    "--service-account-private-key-file={}",
                    certs.sa_key.display()
                ),
                format!("--root-ca-file={}", certs.ca_cert.display()),
                format!("--cluster-signing-cert-file={}", certs.ca_cert.display()),
                format!("--cluster-signing-key-file={}", certs.ca_key.display()),
                "--use-service-account-credentials=false".to_string(),
            ];
            controller_manager = Some(
                start_client_component(
                    "kube-controller-manager",
                    &bins,
                    dir.path(),
                    &kubeconfig,
                    &feature_gates,
                    &extra,
                )
                .await?,
            );
        }

        let kube_proxy = if options.services {
            Some(KubeProxy::start(&bins, dir.path(), &kubeconfig).await?)
        } else {
            None
        };

        let started_in = started.elapsed();
        tracing::info!(dir = %dir.path().display(), ?started_in, version = bins.version(), "control plane ready");
        Ok(ControlPlane {
            bins,
            dir,
            kubeconfig,
            kubeconfig_yaml,
            feature_gates,
            gate_defaults,
            serves_dra: dra,
            _kube_proxy: kube_proxy,
            controller_manager,
            scheduler,
            apiserver,
            etcd,
            _api_server_address: api_server_address,
            started_in,
        })
    }

    /// A client (admin, system:masters) for the calling test's runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from(&self.kubeconfig_yaml).await
    }

    /// The admin client's configuration, for clients built differently (e.g. through a
    /// [`TcpProxy`](crate::TcpProxy), or with extra layers).
    pub async fn client_config(&self) -> Result<kube::Config, Error> {
        kube::Config::from_custom_kubeconfig(
            self.kubeconfig_yaml.clone(),
            &KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// An admin client whose requests carry user agent `agent`, by which the audit log tells
    /// them apart ([`audited_writes`](Self::audited_writes)).
    pub async fn client_with_agent(&self, agent: &str) -> Result<kube::Client, Error> {
        let config = with_user_agent(self.client_config().await?, agent);
        kube::Client::try_from(config).map_err(|e| Error::Kubeconfig(e.to_string()))
    }

    /// The API server's address (host:port on loopback, or on the address pods reach with
    /// [`services`](ControlPlaneOptions::services)), e.g. as a [`TcpProxy`]'s upstream.
    ///
    /// [`TcpProxy`]: crate::TcpProxy
    pub fn api_server_address(&self) -> std::net::SocketAddr {
        let server = &self.kubeconfig_yaml.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .expect("the harness writes a server");
        let authority = server.trim_start_matches("https://").trim_end_matches('/');
        authority.parse().expect("an address and port")
    }

    /// Writes a kubeconfig for a process under test to `path`: the admin's credentials,
    /// reaching the API server at `server` (e.g. a [`TcpProxy`]) if given, and impersonating
    /// `user` if given (to run a component under the RBAC it documents).
    ///
    /// [`TcpProxy`]: crate::TcpProxy
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        server: Option<std::net::SocketAddr>,
        user: Option<&str>,
    ) -> Result<(), Error> {
        let mut kubeconfig = self.kubeconfig_yaml.clone();
        if let Some(server) = server {
            for cluster in &mut kubeconfig.clusters {
                if let Some(cluster) = cluster.cluster.as_mut() {
                    cluster.server = Some(format!("https://{server}"));
                }
            }
        }
        if let Some(user) = user {
            for auth in &mut kubeconfig.auth_infos {
                if let Some(auth) = auth.auth_info.as_mut() {
                    auth.impersonate = Some(user.to_string());
                }
            }
        }
        // JSON is YAML: every kubeconfig reader takes it.
        let json = serde_json::to_vec(&kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        std::fs::write(path, json).map_err(Error::io("write a kubeconfig"))
    }

    /// Writes the kubeconfig of the kubelet of node `node`: a client certificate for
    /// `system:node:<node>` in `system:nodes`, so the Node authorizer and the NodeRestriction
    /// admission plugin treat it as they treat any kubelet.
    pub fn write_node_kubeconfig(&self, path: &Path, node: &str) -> Result<(), Error> {
        let (cert, key) = crate::certs::client_cert(
            &self.dir.path().join("ca.key"),
            &format!("system:node:{node}"),
            "system:nodes",
        )?;
        let ca = std::fs::read(self.dir.path().join("ca.crt")).map_err(Error::io("read ca.crt"))?;
        let base64 = |pem: &[u8]| base64::engine::general_purpose::STANDARD.encode(pem);
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "akri-testing", "cluster": {
                "server": format!("https://{}", self.api_server_address()),
                "certificate-authority-data": base64(&ca),
            }}],
            "users": [{ "name": node, "user": {
                "client-certificate-data": base64(cert.as_bytes()),
                "client-key-data": base64(key.as_bytes()),
            }}],
            "contexts": [{ "name": node, "context": { "cluster": "akri-testing", "user": node } }],
            "current-context": node,
        });
        std::fs::write(path, kubeconfig.to_string()).map_err(Error::io("write a kubeconfig"))
    }

    /// The admin kubeconfig file, for processes under test.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory with the components' logs, certificates and etcd data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every write (create, update, patch, delete) the API server has audited so far, in the
    /// order it took them: who, with which user agent, to what, and its answer. What a client
    /// wrote, as the API server saw it: give each client under test a user agent of its own
    /// (a `user-agent` entry in its `kube::Config::headers`).
    pub fn audited_writes(&self) -> Result<Vec<AuditedWrite>, Error> {
        let path = self.dir.path().join(AUDIT_LOG);
        let text = std::fs::read_to_string(&path).map_err(Error::io("read the audit log"))?;
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| event["stage"] == "ResponseComplete")
            .map(|event| {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                let object = &event["objectRef"];
                AuditedWrite {
                    user_agent: text(&event["userAgent"]),
                    user: text(&event["user"]["username"]),
                    verb: text(&event["verb"]),
                    resource: match text(&object["subresource"]) {
                        sub if sub.is_empty() => text(&object["resource"]),
                        sub => format!("{}/{sub}", text(&object["resource"])),
                    },
                    namespace: text(&object["namespace"]),
                    name: text(&object["name"]),
                    code: event["responseStatus"]["code"].as_i64().unwrap_or_default(),
                }
            })
            .collect())
    }

    /// The binaries this control plane runs.
    pub fn bins(&self) -> &BinDir {
        &self.bins
    }

    /// Whether DRA is on (`resource.k8s.io/v1` served): not on 1.33 and older, where it is
    /// beta and off by default.
    pub fn serves_dra(&self) -> bool {
        self.serves_dra
    }

    /// The `--feature-gates` value every component got.
    pub fn feature_gates(&self) -> &str {
        &self.feature_gates
    }

    /// Whether feature gate `name` is on: as `--feature-gates` sets it, else its default, and
    /// on when the binary no longer lists it (GA, locked on; e.g. DRADeviceTaints in 1.37).
    pub fn gate_enabled(&self, name: &str) -> bool {
        let set = (self.feature_gates.split(','))
            .find_map(|gate| gate.strip_prefix(name)?.strip_prefix('='));
        match set {
            Some(value) => value == "true",
            None => self.gate_defaults.get(name).copied().unwrap_or(true),
        }
    }

    /// What the API server keeps, by the feature gates this control plane runs with: the
    /// oracle for tests that branch on a capability, independent of dra-plugin's probe (which
    /// `slices_apiserver::api_support_is_read_back_from_the_server_and_nothing_is_stored`
    /// checks against it), so that a probe gone wrong fails a test rather than steering it.
    pub fn capabilities(&self) -> Capabilities {
        let gate = |name: &str| self.gate_enabled(name);
        // Alpha in 1.37 and unknown before (where `gate_enabled` would take it for GA).
        let optional = "DRAOptionalNodeOperations";
        Capabilities {
            consumable_capacity: gate("DRAConsumableCapacity"),
            per_device_node_selection: gate("DRAPartitionableDevices"),
            extended_resource_name: gate("DRAExtendedResource"),
            device_taints: gate("DRADeviceTaints"),
            binding_conditions: gate("DRADeviceBindingConditions")
                && gate("DRAResourceClaimDeviceStatus"),
            optional_node_operations: self.gate_defaults.contains_key(optional) && gate(optional),
        }
    }

    /// How long start-up took, from nothing to every component ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// An error carrying the log tails of every component that is no longer running.
    pub fn check_running(&mut self) -> Result<(), Error> {
        self.etcd.check_running()?;
        self.apiserver.check_running()?;
        if let Some(s) = self.scheduler.as_mut() {
            s.check_running()?;
        }
        if let Some(c) = self.controller_manager.as_mut() {
            c.check_running()?;
        }
        Ok(())
    }

    /// The last lines of one component's log (`etcd`, `kube-apiserver`, `kube-scheduler`,
    /// `kube-controller-manager`), for test failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        crate::process::log_tail(&self.dir.path().join(format!("{component}.log")), lines)
    }

    /// A name no other test of this process has: `<prefix>-<pid>-<n>`.
    pub fn unique_name(prefix: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Creates CRDs (an existing one of the same name is kept, so tests sharing a control
    /// plane may all call this) and waits until each is established.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
        install_crds(&self.client().await?, crds).await
    }

    /// Creates a namespace and its `default` ServiceAccount (so pods can be created even
    /// before, or without, the controller-manager's service-account controller).
    pub async fn create_namespace(&self, prefix: &str) -> Result<String, Error> {
        self.create_namespace_named(&Self::unique_name(prefix))
            .await
    }

    /// [`create_namespace`](Self::create_namespace) under `name` as it is (a name the docs
    /// give, on a control plane of one test suite).
    pub async fn create_namespace_named(&self, name: &str) -> Result<String, Error> {
        let client = self.client().await?;
        let name = name.to_string();
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name }
        }))
        .expect("static namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        let account: ServiceAccount = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "default" }
        }))
        .expect("static service account");
        match Api::<ServiceAccount>::namespaced(client, &name)
            .create(&PostParams::default(), &account)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(name)
    }

    /// Creates a Node object for a simulated node, Ready, untainted, with room for 110 pods. No
    /// kubelet heartbeats it, and the node-lifecycle controller is off, so it stays that way.
    pub async fn create_node(&self, name: &str) -> Result<Node, Error> {
        let nodes = Api::<Node>::all(self.client().await?);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" },
            },
        }))
        .expect("static node");
        nodes.create(&PostParams::default(), &node).await?;
        let resources = serde_json::json!({ "cpu": "8", "memory": "32Gi", "pods": "110" });
        let status = serde_json::json!({
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated node of akri-testing",
                    "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now(),
                    "lastTransitionTime": k8s_openapi::jiff::Timestamp::now(),
                }],
            }
        });
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        // The TaintNodesByCondition admission plugin taints every new node not-ready; the
        // node-lifecycle controller (off here) would lift it once the node is Ready.
        let untaint = serde_json::json!({ "spec": { "taints": null } });
        Ok(nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&untaint))
            .await?)
    }
}

/// Starts kube-scheduler or kube-controller-manager (API clients with their own serving port
/// for health checks) with the flags they share plus `extra`, and waits for `/healthz`.
/// The prefix of every control plane's directory in the temporary directory.
const DIR_PREFIX: &str = "akri-k8s-";
/// The file in a control plane's directory that names the process it belongs to.
const OWNER_FILE: &str = "owner.pid";

/// Removes the directories of control planes whose process is gone, once per process. A
/// shared control plane lives in a static, which is never dropped, so its directory (etcd's
/// data, about 120 MB) outlives the test binary; without this, every run left some behind.
fn sweep_orphans() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_orphans_in(&std::env::temp_dir()));
}

fn sweep_orphans_in(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        // No owner file: another process is creating it right now (or it predates
        // owners); leave it.
        let Some(owner) = ours
            .then(|| std::fs::read_to_string(path.join(OWNER_FILE)).ok())
            .flatten()
        else {
            continue;
        };
        let alive = Path::new("/proc").join(owner.trim()).exists();
        if !alive {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

async fn start_client_component(
    name: &str,
    bins: &BinDir,
    dir: &Path,
    kubeconfig: &Path,
    feature_gates: &str,
    extra: &[String],
) -> Result<Component, Error> {
    let port = free_port()?;
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", dir.join(format!("{name}-certs")).display()),
        format!("--feature-gates={feature_gates}"),
        "--v=2".into(),
    ];
    args.extend_from_slice(extra);
    let mut component = Component::start(name, &bins.require(name)?, &args, dir)?;
    wait_healthz(&mut component, port).await?;
    Ok(component)
}

/// `--feature-gates`: every beta DRA gate the binary knows is on (some are beta but off by
/// default), then the test's own gates. Where DRA itself is still beta and off by default
/// (`DynamicResourceAllocation`, 1.32 and 1.33), it stays off with every other DRA gate, as
/// on the clusters of that release: their API server serves no `resource.k8s.io`, and with
/// the gates on it would not become ready either. Returns the gates and whether DRA is on.
fn feature_gates(
    bins: &BinDir,
    options: &ControlPlaneOptions,
) -> Result<(String, bool, BTreeMap<String, bool>), Error> {
    let help = std::process::Command::new(bins.require("kube-apiserver")?)
        .arg("--help")
        .output()
        .map_err(Error::io("run kube-apiserver --help"))?;
    let help = String::from_utf8_lossy(&help.stdout);
    let (beta_gates, dra) = dra_gates(&help);
    let mut gates: BTreeMap<String, bool> = match dra {
        true => beta_gates.into_iter().map(|gate| (gate, true)).collect(),
        false => BTreeMap::new(),
    };
    let known = gate_defaults(&help);
    gates.extend(
        (options.feature_gates_if_known.iter())
            .filter(|(name, _)| known.contains_key(*name))
            .map(|(name, on)| (name.clone(), *on)),
    );
    gates.extend(options.feature_gates.clone());
    let joined = |gates: &BTreeMap<String, bool>| {
        gates
            .iter()
            .map(|(name, on)| format!("{name}={on}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    // A beta gate can depend on a gate that is off by default (1.37: DRAWorkloadResourceClaims
    // on GenericWorkload), and the API server then refuses to start. It says so at once, before
    // it needs etcd or certificates, so ask it, and leave out each of our gates it names.
    loop {
        let probe = std::process::Command::new(bins.require("kube-apiserver")?)
            .arg(format!("--feature-gates={}", joined(&gates)))
            .output()
            .map_err(Error::io("run kube-apiserver --feature-gates"))?;
        match unmet_dependency(&String::from_utf8_lossy(&probe.stderr)) {
            Some(gate)
                if !options.feature_gates.contains_key(gate) && gates.remove(gate).is_some() => {}
            _ => break,
        }
    }
    Ok((joined(&gates), dra, known))
}

/// Every gate `--help` lists (`kube:<name>=true|false (<STAGE> - default=<bool>)`), with its
/// default.
fn gate_defaults(help: &str) -> BTreeMap<String, bool> {
    (help.lines())
        .filter_map(|line| {
            let (name, rest) = line
                .trim()
                .strip_prefix("kube:")?
                .split_once("=true|false (")?;
            let default = rest.split_once("default=")?.1;
            Some((name.to_string(), default.starts_with("true")))
        })
        .collect()
}

/// The gate the API server names in "<gate> is enabled, but depends on features that are
/// disabled: [...]".
fn unmet_dependency(stderr: &str) -> Option<&str> {
    let (before, _) =
        stderr.split_once(" is enabled, but depends on features that are disabled")?;
    before
        .rsplit(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .filter(|gate| !gate.is_empty())
}

/// The beta DRA gates `kube-apiserver --help` lists, and whether DRA is on by default (GA, or
/// beta and on).
fn dra_gates(help: &str) -> (Vec<String>, bool) {
    let mut gates = Vec::new();
    let mut dra = true;
    for line in help.lines() {
        let Some(rest) = line.trim().strip_prefix("kube:") else {
            continue;
        };
        let Some((name, stage)) = rest.split_once("=true|false (") else {
            continue;
        };
        if name == "DynamicResourceAllocation" && stage.starts_with("BETA - default=false") {
            dra = false;
        }
        if stage.starts_with("BETA")
            && (name.starts_with("DRA") || name == "DynamicResourceAllocation")
        {
            gates.push(name.to_string());
        }
    }
    (gates, dra)
}

fn kubeconfig_yaml(server: &str, certs: &Certs) -> String {
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: akri-testing
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: akri-testing
  context:
    cluster: akri-testing
    user: admin
current-context: akri-testing
",
        ca = b64(&certs.ca_pem),
        cert = b64(&certs.admin_cert_pem),
        key = b64(&certs.admin_key_pem),
    )
}

async fn client_from(kubeconfig: &Kubeconfig) -> Result<kube::Client, Error> {
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("static request")
}

/// Polls `ready` until it holds, failing early (with the log tail) if the process exits.
async fn wait_until<F, Fut>(
    name: &str,
    component: &mut Component,
    mut ready: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        component.check_running()?;
        if ready().await {
            tracing::debug!(component = name, elapsed = ?start.elapsed(), "ready");
            return Ok(());
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(component.not_ready(READY_TIMEOUT.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for a component's `/healthz` on its own serving port (self-signed certificate).
async fn wait_healthz(component: &mut Component, port: u16) -> Result<(), Error> {
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(2))
        .build()?;
    let url = format!("https://127.0.0.1:{port}/healthz");
    let name = component.name.clone();
    wait_until(&name, component, || async {
        match http.get(&url).send().await {
            Ok(response) => response.status().is_success(),
            Err(_) => false,
        }
    })
    .await
}

/// Creates `crds` (an existing one is kept) and waits until each is established.
async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
) -> Result<(), Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in crds {
        match api.create(&PostParams::default(), crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let start = Instant::now();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let established = api
                .get(&name)
                .await?
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(Error::Other(format!("CRD {name} not established")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_dead_processes_are_swept_and_others_kept() {
        let temp = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        gone.wait().unwrap();
        let owned = |name: &str, pid: Option<u32>| {
            let dir = temp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            if let Some(pid) = pid {
                std::fs::write(dir.join(OWNER_FILE), pid.to_string()).unwrap();
            }
            dir
        };
        let dead = owned("akri-k8s-dead", Some(gone.id()));
        let alive = owned("akri-k8s-alive", Some(std::process::id()));
        let unowned = owned("akri-k8s-unowned", None);
        let other = owned("something-else", Some(gone.id()));
        sweep_orphans_in(temp.path());
        assert!(!dead.exists());
        assert!(alive.exists() && unowned.exists() && other.exists());
    }

    /// Lines as `kube-apiserver --help` prints them (1.33.13 and 1.36.3).
    #[test]
    fn dra_stays_off_where_it_is_beta_and_off_by_default() {
        let v1_33 = "      kube:DRAAdminAccess=true|false (ALPHA - default=false)
      kube:DRAResourceClaimDeviceStatus=true|false (BETA - default=true)
      kube:DynamicResourceAllocation=true|false (BETA - default=false)";
        assert_eq!(
            dra_gates(v1_33),
            (
                vec![
                    "DRAResourceClaimDeviceStatus".to_string(),
                    "DynamicResourceAllocation".to_string()
                ],
                false
            )
        );
        let v1_36 = "      kube:DRAConsumableCapacity=true|false (BETA - default=true)
      kube:DRADeviceTaintRules=true|false (BETA - default=false)
      kube:DRAPartitionableDevices=true|false (ALPHA - default=false)";
        let (gates, dra) = dra_gates(v1_36);
        assert!(dra);
        assert_eq!(gates, ["DRAConsumableCapacity", "DRADeviceTaintRules"]);
    }

    #[test]
    fn gate_defaults_are_read_from_the_help() {
        let help = "      kube:DRAConsumableCapacity=true|false (BETA - default=true)
      kube:DRAWorkloadResourceClaims=true|false (BETA - default=false)";
        let defaults = gate_defaults(help);
        assert_eq!(defaults.get("DRAConsumableCapacity"), Some(&true));
        assert_eq!(defaults.get("DRAWorkloadResourceClaims"), Some(&false));
    }

    /// As 1.37.2's kube-apiserver exits with DRAWorkloadResourceClaims on alone.
    #[test]
    fn a_gate_whose_dependency_is_off_is_named() {
        let stderr = r#"E1127 02:17:44.464924   15743 run.go:72] "command failed" err="DRAWorkloadResourceClaims is enabled, but depends on features that are disabled: [GenericWorkload]""#;
        assert_eq!(unmet_dependency(stderr), Some("DRAWorkloadResourceClaims"));
        assert_eq!(
            unmet_dependency("err=\"--etcd-servers must be specified\""),
            None
        );
    }
}

/// What a control plane's API server keeps of DRA, field for field as dra-plugin's
/// `ApiSupport` names it ([`ControlPlane::capabilities`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    pub consumable_capacity: bool,
    pub per_device_node_selection: bool,
    pub extended_resource_name: bool,
    pub device_taints: bool,
    pub binding_conditions: bool,
    pub optional_node_operations: bool,
}
