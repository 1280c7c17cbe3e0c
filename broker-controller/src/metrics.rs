//! Prometheus metrics of the broker-controller, served with `/healthz` and `/readyz` by
//! `akri_runtime::http`.

use crate::apply::Outcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// What happened to broker objects (`apply`, `delete` or `refused`), or to a reconciliation
/// (`ok` or `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub result: String,
}

/// Shared, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    writes: Family<WriteLabels, Counter>,
    reconciles: Family<WriteLabels, Counter>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("akri_broker_controller");
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "object_writes",
            "Broker objects applied or deleted, and writes the API server refused",
            writes.clone(),
        );
        let reconciles = Family::<WriteLabels, Counter>::default();
        registry.register(
            "reconciles",
            "BrokerTemplates reconciled, by result (`ok` or `error`)",
            reconciles.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the Lease",
            leader.clone(),
        );
        // Every series at 0 from the start: a rate over a first refusal has a sample before
        // it (an alert sees the first one).
        for result in ["apply", "delete", "refused"] {
            drop(writes.get_or_create(&WriteLabels {
                result: result.into(),
            }));
        }
        for result in ["ok", "error"] {
            drop(reconciles.get_or_create(&WriteLabels {
                result: result.into(),
            }));
        }
        Metrics {
            registry: Arc::new(registry),
            writes,
            reconciles,
            leader,
        }
    }
}

impl Metrics {
    pub fn applied(&self, outcome: &Outcome) {
        for (result, n) in [
            ("apply", outcome.applied),
            ("delete", outcome.deleted),
            ("refused", outcome.refused.len()),
        ] {
            self.writes
                .get_or_create(&WriteLabels {
                    result: result.into(),
                })
                .inc_by(n as u64);
        }
    }

    pub fn reconciled(&self, ok: bool) {
        self.reconciles
            .get_or_create(&WriteLabels {
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader as i64);
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        akri_runtime::http::encode(&self.registry)
    }
}
