//! Prometheus metrics of the kubelet-plugin, served with `/healthz` and `/readyz` by
//! `akri_runtime::http`.

use akri_legacy_device_plugin::plugins::Counters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Which DRA driver (discovery handler) a value is of.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriverLabels {
    pub driver: String,
}

/// How a claim's preparation ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrepareLabels {
    pub driver: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Whether a change of the prepared claims needed a pass of the node loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WakeLabels {
    /// `pass` (a vanished device waited for its release) or `quiet`.
    pub outcome: String,
}

/// Shared, cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    prepare_seconds: Family<PrepareLabels, Histogram>,
    devices_published: Family<DriverLabels, Gauge>,
    discovery_errors: Gauge,
    passes: Counter,
    claim_wakes: Family<WakeLabels, Counter>,
    legacy: Arc<OnceLock<Arc<Counters>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("akri_kubelet_plugin");
        // 1 ms to ~4 s: a claim read, a CDI spec write and an fsync'd checkpoint.
        let prepare_seconds = Family::<PrepareLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 13,
            ))
        });
        registry.register(
            "prepare_seconds",
            "Time to prepare one claim for the kubelet (claim read and CDI spec), by driver and result",
            prepare_seconds.clone(),
        );
        let devices_published = Family::<DriverLabels, Gauge>::default();
        registry.register(
            "devices_published",
            "Devices in this node's ResourceSlice pool, by driver",
            devices_published.clone(),
        );
        let discovery_errors = Gauge::default();
        registry.register(
            "discovery_errors",
            "Configurations whose discovery fails on this node (their status.discoveryErrors entry)",
            discovery_errors.clone(),
        );
        let passes = Counter::default();
        registry.register(
            "passes",
            "Passes of the node agent's loop (discovery brought in line with the configurations, the changed drivers published); prepares and unprepares set off none",
            passes.clone(),
        );
        let claim_wakes = Family::<WakeLabels, Counter>::default();
        registry.register(
            "claim_wakes",
            "Changes of the prepared claims the node loop took, by whether they needed a pass (only the release of a vanished device does)",
            claim_wakes.clone(),
        );
        for outcome in ["pass", "quiet"] {
            drop(claim_wakes.get_or_create(&WakeLabels {
                outcome: outcome.into(),
            }));
        }
        let legacy = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(LegacyCollector(legacy.clone())));
        Metrics {
            registry: Arc::new(registry),
            prepare_seconds,
            devices_published,
            discovery_errors,
            passes,
            claim_wakes,
            legacy,
        }
    }
}

impl Metrics {
    /// `driver` is served: its series exist from now on, at 0 (a rate over a first failed
    /// prepare has a sample before it, so an alert sees the first failure).
    pub fn serving(&self, driver: &str) {
        for result in ["ok", "error"] {
            drop(self.prepare_seconds.get_or_create(&PrepareLabels {
                driver: driver.into(),
                result: result.into(),
            }));
        }
        drop(self.devices_published.get_or_create(&DriverLabels {
            driver: driver.into(),
        }));
    }

    pub fn prepared(&self, driver: &str, ok: bool, took: Duration) {
        self.prepare_seconds
            .get_or_create(&PrepareLabels {
                driver: driver.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn set_devices_published(&self, driver: &str, n: usize) {
        self.devices_published
            .get_or_create(&DriverLabels {
                driver: driver.into(),
            })
            .set(n as i64);
    }

    pub fn set_discovery_errors(&self, n: usize) {
        self.discovery_errors.set(n as i64);
    }

    pub fn passed(&self) {
        self.passes.inc();
    }

    /// The node loop took a change of the prepared claims; `pass` whether one follows.
    pub fn claims_woke(&self, pass: bool) {
        let outcome = if pass { "pass" } else { "quiet" };
        (self.claim_wakes)
            .get_or_create(&WakeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Where the legacy path puts its allocation counters once its plugins run; they are
    /// served from then on.
    pub fn legacy_counters(&self) -> &Arc<OnceLock<Arc<Counters>>> {
        &self.legacy
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        akri_runtime::http::encode(&self.registry)
    }
}

/// The legacy device plugins' counters, read at each scrape (nothing before the plugins run).
#[derive(Debug)]
struct LegacyCollector(Arc<OnceLock<Arc<Counters>>>);

impl Collector for LegacyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(counters) = self.0.get() else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "legacy_allocations",
                "Allocate calls the legacy device plugins answered with devices",
                &counters.allocations,
            ),
            (
                "legacy_failed_allocations",
                "Allocate calls the legacy device plugins refused",
                &counters.failed_allocations,
            ),
            (
                "legacy_slot_claims",
                "Instance slots taken with a write (reusing a slot this node holds writes nothing)",
                &counters.claims,
            ),
            (
                "legacy_slot_conflicts",
                "Slot claims that lost to a concurrent writer",
                &counters.conflicts,
            ),
            (
                "legacy_slots_reclaimed",
                "Slots of this node freed because no container held them",
                &counters.reclaimed,
            ),
        ] {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// A driver whose preparations are timed into [`Metrics`].
pub struct Timed<D> {
    pub inner: D,
    pub driver: String,
    pub metrics: Metrics,
}

impl<D: dra_plugin::Driver> dra_plugin::Driver for Timed<D> {
    type Error = D::Error;

    async fn prepare(&self, claim: &dra_plugin::Claim) -> Result<dra_plugin::Prepared, D::Error> {
        let started = std::time::Instant::now();
        let result = self.inner.prepare(claim).await;
        self.metrics
            .prepared(&self.driver, result.is_ok(), started.elapsed());
        result
    }

    async fn unprepare(
        &self,
        claim: &dra_plugin::ClaimRef,
        prepared: Option<&dra_plugin::PreparedClaim>,
    ) -> Result<(), D::Error> {
        self.inner.unprepare(claim, prepared).await
    }
}
