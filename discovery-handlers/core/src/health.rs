//! What a handler binary says about itself (`--health-address`): `/healthz`, `/readyz`
//! (ready once registered with the node agent, otherwise why not) and `/metrics`.
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
    pub readiness: Readiness,
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
        let readiness = Readiness::default();
        readiness.not_ready("not registered with the node agent yet");
        Health {
            registry: Arc::new(registry),
            registered,
            registrations,
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
