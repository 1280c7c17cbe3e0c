//! What a handler binary says about itself (`--health-address`): `/healthz`, `/readyz`
//! (ready once registered with the node agent, otherwise why not) and `/metrics`: its
//! registrations, and its discovery ([`DiscoveryMetrics`]: calls, open streams, devices).
//!
//! A handler that never reaches the agent (a wrong directory, the agent not on the node)
//! discovers nothing for anyone; before this it looked healthy.

use akri_runtime::http::Readiness;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The handler's metrics and readiness.
#[derive(Clone)]
pub struct Health {
    registry: Arc<Registry>,
    registered: Gauge,
    registrations: Family<Vec<(String, String)>, Counter>,
    pub discovery: DiscoveryMetrics,
    pub readiness: Readiness,
}

/// What the handler's discovery does, as the agent asks for it: one stream per configuration.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryMetrics {
    /// `Discover` calls, by result: `ok`, or `refused` (details the handler cannot use).
    pub(crate) calls: Family<Vec<(String, String)>, Counter>,
    /// Discovery streams open now.
    pub(crate) streams: Gauge,
    /// Devices in the last list of each open stream, summed.
    pub(crate) devices: Gauge,
    /// Device lists sent (only a list that changed is sent).
    pub(crate) lists: Counter,
}

impl DiscoveryMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "discover_calls",
            "Discover calls from the node agent, by result (ok, refused: details the handler cannot use)",
            self.calls.clone(),
        );
        for result in ["ok", "refused"] {
            drop(
                self.calls
                    .get_or_create(&vec![("result".to_string(), result.to_string())]),
            );
        }
        registry.register(
            "streams",
            "Discovery streams open now (one per configuration the node agent discovers for)",
            self.streams.clone(),
        );
        registry.register(
            "devices",
            "Devices in the last list of each open stream, summed",
            self.devices.clone(),
        );
        registry.register(
            "device_lists",
            "Device lists sent to the node agent (a list is sent when it changed)",
            self.lists.clone(),
        );
    }

    pub(crate) fn called(&self, result: &str) {
        let labels = vec![("result".to_string(), result.to_string())];
        self.calls.get_or_create(&labels).inc();
    }
}

impl Default for Health {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("akri_discovery_handler");
        let registered = Gauge::default();
        registry.register(
            "registered",
            "1 while the handler is registered with the node agent",
            registered.clone(),
        );
        let registrations = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "registrations",
            "Registrations with the node agent, by result (ok, error); a registered handler registers again every 30 s",
            registrations.clone(),
        );
        // Both series at 0 from the start: a rate over a first failure has a sample before it.
        for result in ["ok", "error"] {
            drop(registrations.get_or_create(&vec![("result".to_string(), result.to_string())]));
        }
        let discovery = DiscoveryMetrics::default();
        discovery.register(&mut registry);
        let readiness = Readiness::default();
        readiness.not_ready("not registered with the node agent yet");
        Health {
            registry: Arc::new(registry),
            registered,
            registrations,
            discovery,
            readiness,
        }
    }
}

impl Health {
    /// A registration went through.
    pub fn registered(&self) {
        self.count("ok");
        self.registered.set(1);
        self.readiness.ready();
    }

    /// A registration failed, with why.
    pub fn not_registered(&self, why: &str) {
        self.count("error");
        self.registered.set(0);
        self.readiness
            .not_ready(format!("not registered with the node agent: {why}"));
    }

    fn count(&self, result: &str) {
        let labels = vec![("result".to_string(), result.to_string())];
        self.registrations.get_or_create(&labels).inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        akri_runtime::http::encode(&self.registry)
    }
}
