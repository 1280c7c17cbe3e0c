//! What the broker-controller's suites share: both controllers started in the test's runtime,
//! reacting within 100 ms.

use akri_broker_controller::controller::{self, ControllerConfig};
use akri_broker_controller::metrics::Metrics;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The driver-controller (DeviceClasses, shared devices) for the Instances in `namespace`.
pub fn spawn_driver_controller(client: &kube::Client, namespace: &str) -> JoinHandle<()> {
    let mut config = akri_driver_controller::controller::ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let client = client.clone();
    tokio::spawn(async move {
        akri_driver_controller::controller::run(client, config, Default::default())
            .await
            .expect("driver-controller runs")
    })
}

/// The broker-controller for the Instances in `namespace`, and its metrics.
pub fn spawn_broker_controller(
    client: &kube::Client,
    namespace: &str,
) -> (JoinHandle<()>, Metrics) {
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let metrics = Metrics::default();
    let task = tokio::spawn(controller::run(client.clone(), config, metrics.clone()));
    (task, metrics)
}
