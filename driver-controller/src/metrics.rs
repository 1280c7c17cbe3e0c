//! Prometheus metrics of the driver-controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// What a write was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `deviceclass`, `resourceslice`, `status`, `lease`.
    pub resource: String,
    /// `apply`, `delete`, `create`, `update`.
    pub verb: String,
}

/// How a reconciliation ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// Shared, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    writes: Family<WriteLabels, Counter>,
    reconciles: Family<ResultLabels, Counter>,
    leader: Gauge,
    shared_devices: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("akri_driver_controller");
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes to the API server, by resource and verb",
            writes.clone(),
        );
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciliations of DiscoveryConfigurations, by result",
            reconciles.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let shared_devices = Gauge::default();
        registry.register(
            "shared_devices",
            "Shared devices published by this replica (slot devices counted one by one)",
            shared_devices.clone(),
        );
        // Every series at 0 from the start: a rate over a first error has a sample before it
        // (an alert sees the first failure), and a replica that never wrote still says so.
        for (resource, verb) in WRITES {
            drop(writes.get_or_create(&WriteLabels {
                resource: resource.into(),
                verb: verb.into(),
            }));
        }
        for result in ["ok", "error"] {
            drop(reconciles.get_or_create(&ResultLabels {
                result: result.into(),
            }));
        }
        Metrics {
            registry: Arc::new(registry),
            writes,
            reconciles,
            leader,
            shared_devices,
        }
    }
}

/// The `(resource, verb)` of every write it counts ([`Metrics::wrote`]).
const WRITES: [(&str, &str); 8] = [
    ("deviceclass", "apply"),
    ("deviceclass", "delete"),
    ("resourceslice", "apply"),
    ("resourceslice", "delete"),
    ("status", "apply"),
    ("status", "forget-node"),
    ("instance", "forget-node"),
    ("instance", "free-slot"),
];

impl Metrics {
    /// Counts `n` writes.
    pub fn wrote(&self, resource: &str, verb: &str, n: u64) {
        if n > 0 {
            self.writes
                .get_or_create(&WriteLabels {
                    resource: resource.into(),
                    verb: verb.into(),
                })
                .inc_by(n);
        }
    }

    pub fn reconciled(&self, ok: bool) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn set_shared_devices(&self, n: usize) {
        self.shared_devices.set(n as i64);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        akri_runtime::http::encode(&self.registry)
    }
}
