//! The node agent: discovery in ([`crate::node_discovery`]), DRA ([`crate::dra_sink`]) and,
//! where asked for, legacy device plugins ([`crate::legacy`]) out, all from one loop
//! ([`crate::node_loop`]). This module is how it starts; what it is configured with is
//! [`AgentConfig`] (`config.rs`), what only the node's leading agent runs is
//! `leader.rs`.

use crate::binding_check::BindingChecks;
pub use crate::config::{AgentConfig, RESYNC};
use crate::discovery::Registry;
use crate::dra_sink::{DraOptions, DraSink};
use crate::handler_lease::HandlerLease;
use crate::leader::{Takeover, lead};
use crate::legacy::LegacySink;
use crate::metrics::Metrics;
use crate::node_devices::NodeDevices;
use crate::node_discovery::{NodeDiscovery, Sink};
use crate::node_loop::NodeLoop;
use crate::state_dir::StateDir;
use crate::streams::StreamEvent;
use akri_legacy_device_plugin::plugins::Counters;
use akri_runtime::http::Readiness;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Errors that stop the agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::Error),
    #[error(transparent)]
    Lead(#[from] crate::leader::Error),
    #[error("reading node {node}: {cause}")]
    Node { node: String, cause: kube::Error },
    #[error("asking the API server what it supports: {0}")]
    ApiSupport(dra_plugin::api_support::Error),
    #[error(
        "nothing to serve: {0}, and the legacy device plugins are off (--legacy-device-plugins, \
         chart value legacyDevicePlugin.enabled)"
    )]
    NothingToServe(&'static str),
    #[error("connecting to the API server: {0}")]
    Client(kube::Error),
    #[error("serving /metrics, /healthz and /readyz: {0}")]
    Http(std::io::Error),
    #[error("waiting for SIGTERM: {0}")]
    Signal(std::io::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The process: the client of its ServiceAccount (or kubeconfig), the agent, its metrics and
/// health endpoints on `metrics_address`, until SIGTERM or Ctrl-C stops the agent cleanly.
/// One thread: the agent waits on the kubelet, its handlers and the API server.
pub fn run_process(
    config: AgentConfig,
    metrics_address: std::net::SocketAddr,
) -> Result<(), Error> {
    let main = async move {
        let client = kube::Client::try_default().await.map_err(Error::Client)?;
        let agent = start(client, config).await?;
        let metrics = agent.metrics().clone();
        let (_, _server) = akri_runtime::http::serve(
            metrics_address,
            move || metrics.encode(),
            agent.readiness().clone(),
        )
        .await
        .map_err(Error::Http)?;
        tracing::info!("running");
        akri_runtime::stopped().await.map_err(Error::Signal)?;
        agent.stop().await;
        Ok(())
    };
    akri_runtime::block_on(akri_runtime::Workers::CurrentThread, main).map_err(Error::Runtime)?
}

/// A running agent; [`Agent::stop`] stops it cleanly, dropping it at once.
pub struct Agent {
    task: tokio::task::JoinHandle<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _binding_checks: Option<tokio_util::task::AbortOnDropHandle<()>>,
    devices: NodeDevices,
    metrics: Metrics,
    readiness: Readiness,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Agent {
    /// Stops cleanly (on SIGTERM): withdraws the DRA drivers' registrations, answers the
    /// kubelet's calls under way, then stops everything, the node's lock last, so that an
    /// agent standing by takes over without a failed call.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// The legacy path's allocation counters, once its plugins run.
    pub fn legacy_counters(&self) -> Option<Arc<Counters>> {
        self.metrics.legacy_counters().get().cloned()
    }

    /// The devices this node currently sees.
    pub fn devices(&self) -> &NodeDevices {
        &self.devices
    }

    /// What `/metrics` serves.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Ready once the start-up gate has opened (discovery answered, or its wait ran out),
    /// while the configurations can be watched.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }
}

/// Starts the agent.
pub async fn start(client: kube::Client, config: AgentConfig) -> Result<Agent, Error> {
    // Before anything on the node is touched: one agent leads per state directory, out of the
    // handlers' reach. A rolling update's new pod stands by while the old one leads.
    let unlocked = StateDir::prepare(&config.state_dir, config.discovery_socket.parent())?;
    let standby = config.pod_uid.is_some() && unlocked.held_elsewhere()?;
    let (leading, pending) = match standby {
        true => {
            tracing::info!(
                "another kubelet-plugin leads this node: standing by, serving the DRA drivers beside it"
            );
            (None, Some(unlocked))
        }
        false => (Some(unlocked.lock().await?), None),
    };
    let registry = Registry::load(
        &config.discovery_socket,
        &config.state_dir.join("discovery-handlers.json"),
        &config.own_handler_directories,
    );
    let node = crate::api_call(Api::<Node>::all(client.clone()).get(&config.node_name))
        .await
        .map_err(|cause| Error::Node {
            node: config.node_name.clone(),
            cause,
        })?;
    let node_uid = node.metadata.uid.unwrap_or_default();
    let (metrics, readiness) = (Metrics::default(), Readiness::default());
    let serve_dra = serves_dra(&client, &config, &readiness).await?;
    let sinks = sinks(
        &client,
        &config,
        (&node_uid, &metrics),
        serve_dra,
        leading.is_some(),
    );
    let (dra, legacy, devices) = sinks.await?;
    let handlers = registry.subscribe();
    let (leader, registry) = match leading {
        Some(state_dir) => (Some(lead(&config, registry, state_dir).await?), None),
        None => (None, Some(registry)),
    };
    let (events_tx, events) = mpsc::channel::<StreamEvent>(64);
    let discovery = NodeDiscovery::new(
        client.clone(),
        (&config.node_name, &node_uid),
        devices,
        config.startup_wait,
        config.property_namespaces.clone(),
        events_tx,
    )
    .handler_access(config.handler_access.clone())
    .host_dev(crate::discovery::HostDev::new(&config.host_dev))
    .property_secrets(config.property_secrets.clone());
    let devices = discovery.devices(Sink::Dra);
    let binding_checks = binding_checks(&client, &config, serve_dra, &devices).await?;
    let handler_lease = dra.is_some().then(|| {
        HandlerLease::new(
            client.clone(),
            &config.instance_namespace,
            &config.node_name,
        )
    });
    let node_loop = NodeLoop {
        client: client.clone(),
        node_name: config.node_name.clone(),
        discovery,
        dra,
        legacy,
        leader,
        startup_wait: config.startup_wait,
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        refused_v0: Default::default(),
        resync: config.resync,
        mirror_namespace: config.instance_namespace.clone(),
        handler_lease,
    };
    // Standing by: the takeover holds the registry (not served yet) until the lock is free.
    let takeover = pending.zip(registry).map(|(unlocked, registry)| {
        let takeover: Takeover = Box::pin(async move {
            let state_dir = unlocked.lock().await?;
            lead(&config, registry, state_dir).await
        });
        takeover
    });
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(node_loop.run(handlers, events, takeover, stopped));
    Ok(Agent {
        task,
        stop: Some(stop),
        _binding_checks: binding_checks,
        devices,
        metrics,
        readiness,
    })
}

/// The sinks this agent runs (the DRA one if `serve_dra`, the legacy one as configured,
/// `leading` or standing by) and the devices each is fed.
async fn sinks(
    client: &kube::Client,
    config: &AgentConfig,
    (node_uid, metrics): (&str, &Metrics),
    serve_dra: bool,
    leading: bool,
) -> Result<Sinks, Error> {
    let mut devices = BTreeMap::new();
    let dra = match serve_dra {
        true => {
            let sink = dra_sink(client, config, node_uid, metrics).await?;
            devices.insert(Sink::Dra, sink.devices().clone());
            Some(sink)
        }
        false => None,
    };
    let legacy = legacy_sink(client, config, metrics, leading);
    if legacy.is_some() {
        let names = config.state_dir.join("legacy-instance-names.json");
        // No capacity model: a v0 Configuration's capacity is `deviceUsage` slots.
        devices.insert(
            Sink::Legacy,
            NodeDevices::with_names_file(&config.node_name, false, &names)
                .carrying_reports(&config.state_dir.join("legacy-last-reports.json")),
        );
    }
    Ok((dra, legacy, devices))
}

/// The sinks an agent runs, and the devices each is fed.
type Sinks = (
    Option<DraSink>,
    Option<LegacySink>,
    BTreeMap<Sink, NodeDevices>,
);

/// Whether this agent serves DRA: as configured, or as the API server serves
/// `resource.k8s.io/v1`. Without it, the legacy sink alone (said in the readiness), or
/// nothing to serve.
async fn serves_dra(
    client: &kube::Client,
    config: &AgentConfig,
    readiness: &Readiness,
) -> Result<bool, Error> {
    let serve_dra = match config.dra {
        Some(forced) => forced,
        None => dra_plugin::api_support::serves_v1(client)
            .await
            .map_err(Error::ApiSupport)?,
    };
    if !serve_dra {
        let why = match config.dra {
            Some(_) => "DRA is off (--dra=off)",
            None => "DRA is off: the API server serves no resource.k8s.io/v1",
        };
        if config.legacy.is_none() {
            return Err(Error::NothingToServe(why));
        }
        tracing::warn!("{why}; serving Akri v0 Configurations as device plugins only");
        readiness.note(format!("{why}; legacy device plugins only"));
    }
    Ok(serve_dra)
}

/// The legacy sink, where configured. Served standing by too (under this pod's own
/// sockets), so that the kubelet has a plugin to call for every resource all through a
/// rolling update.
fn legacy_sink(
    client: &kube::Client,
    config: &AgentConfig,
    metrics: &Metrics,
    leading: bool,
) -> Option<LegacySink> {
    let options = config.legacy.as_ref()?;
    let tag = (config.pod_uid.as_deref()).map(dra_plugin::registration::pod_tag);
    let (client, grace) = (client.clone(), config.instance_grace);
    let counters = metrics.legacy_counters();
    let mut sink = LegacySink::start(client, &config.node_name, options, grace, tag, counters)
        .limit(config.max_instances_per_configuration);
    if leading {
        sink.lead();
    }
    Some(sink)
}

/// The binding checks of the shared devices allocated to this node, where the API server
/// keeps binding conditions (or as configured).
async fn binding_checks(
    client: &kube::Client,
    config: &AgentConfig,
    serve_dra: bool,
    devices: &NodeDevices,
) -> Result<Option<tokio_util::task::AbortOnDropHandle<()>>, Error> {
    let binding_conditions = match (serve_dra, config.binding_conditions) {
        (false, _) => false,
        (true, Some(forced)) => forced,
        (true, None) => dra_plugin::api_support::binding_conditions(client)
            .await
            .map_err(Error::ApiSupport)?,
    };
    tracing::info!(
        binding_conditions,
        "shared devices checked from this node at binding"
    );
    Ok(binding_conditions.then(|| {
        let timeout = config.binding_check_timeout;
        let at = (
            config.node_name.as_str(),
            config.instance_namespace.as_str(),
        );
        BindingChecks::new(client.clone(), at, devices.clone(), timeout).spawn()
    }))
}

/// The DRA sink: asks the API server what it supports (unless told), then serves nothing yet.
async fn dra_sink(
    client: &kube::Client,
    config: &AgentConfig,
    node_uid: &str,
    metrics: &Metrics,
) -> Result<DraSink, Error> {
    let consumable_capacity = match config.consumable_capacity {
        Some(known) => known,
        None => dra_plugin::api_support::consumable_capacity(client)
            .await
            .map_err(Error::ApiSupport)?,
    };
    tracing::info!(consumable_capacity, "device sharing model");
    let device_taints = match config.device_taints {
        Some(known) => known,
        None => dra_plugin::api_support::device_taints(client)
            .await
            .map_err(Error::ApiSupport)?,
    };
    tracing::info!(
        device_taints,
        "vanished held devices are kept tainted (or, without device taints, dropped)"
    );
    let devices = NodeDevices::with_names_file(
        &config.node_name,
        consumable_capacity,
        &config.state_dir.join("instance-names.json"),
    )
    .carrying_reports(&config.state_dir.join("last-reports.json"));
    let options = DraOptions {
        node_name: config.node_name.clone(),
        node_uid: node_uid.to_string(),
        instance_namespace: config.instance_namespace.clone(),
        registry_dir: config.registry_dir.clone(),
        plugins_dir: config.plugins_dir.clone(),
        cdi_dir: config.cdi_dir.clone(),
        device_metadata: config.device_metadata,
        state_dir: config.state_dir.clone(),
        instance_grace: config.instance_grace,
        max_instances_per_configuration: config.max_instances_per_configuration,
        vanished_grace: config.vanished_grace,
        device_taints,
        kubelet_registration_timeout: config.kubelet_registration_timeout,
        pod_uid: config.pod_uid.clone(),
    };
    Ok(DraSink::new(
        client.clone(),
        options,
        devices,
        metrics.clone(),
    ))
}
