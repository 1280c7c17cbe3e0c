//! Serving a DRA driver (a kubelet plugin) per discovery handler: started as handlers
//! register, each with its checkpoint, CDI directory and health; whether the kubelet took it.

use super::DraSink;
use crate::device_health::Health;
use crate::discovery::Handlers;
use crate::driver::AkriDriver;
use crate::metrics::Timed;
use dra_plugin::cdi::CdiRoot;
use dra_plugin::metadata::Version;
use dra_plugin::registration::RegistrationStatus;
use dra_plugin::vanished::VanishedDevices;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why a discovery handler's DRA driver cannot be served (logged; the others are served).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CDI directory: {0}")]
    Cdi(dra_plugin::cdi::Error),
    #[error("kubelet plugin: {0}")]
    Plugin(dra_plugin::builder::Error),
}

/// One served DRA driver (one discovery handler).
pub(super) struct ServedDriver {
    pub(super) plugin: dra_plugin::Plugin<Timed<AkriDriver>>,
    /// Devices kept (tainted) while prepared claims hold them after they vanished.
    pub(super) vanished: VanishedDevices,
    /// Whether `vanished` has read what a previous process published.
    pub(super) seeded: bool,
    /// Health: every device name published since it started, and which of them are gone now.
    pub(super) health: Health,
    /// When it started serving: a kubelet should take it soon after.
    pub(super) served_at: Instant,
}

impl ServedDriver {
    /// Whether a change of its prepared claims can change what it publishes: only a release of
    /// a vanished device does (so a prepare or an unprepare of a present device costs no pass).
    pub(super) fn waits_on_claims(&self) -> bool {
        self.vanished.any_vanished() || !self.health.gone.is_empty()
    }
}

impl DraSink {
    /// Serves a kubelet plugin per registered handler (before the start-up gate opens too:
    /// the kubelet may prepare claims of the devices published before).
    pub(super) async fn serve(&mut self, handlers: &Handlers) {
        for handler in handlers.values() {
            let driver = akri_devices::driver_name(&handler.name);
            if self.drivers.contains_key(&driver) {
                continue;
            }
            match self.serve_driver(&handler.name, &driver).await {
                Ok(served) => {
                    tokio::spawn(forward_claim_changes(
                        served.plugin.service().prepared_changes(),
                        driver.clone(),
                        self.claims_tx.clone(),
                    ));
                    self.drivers.insert(driver.clone(), served);
                    self.dirty.insert(driver);
                }
                Err(error) => tracing::error!(%driver, %error, "cannot serve the DRA driver"),
            }
        }
    }

    /// Why the node is not ready, if a kubelet refused a driver or took none in time.
    pub(super) fn registration_problem(&mut self) -> Option<String> {
        let registration = self.registration.check(
            self.drivers.iter().map(|(driver, served)| {
                let status = served.plugin.registration_status();
                (driver.as_str(), status, served.served_at)
            }),
            Instant::now(),
            &self.options.registry_dir,
        );
        self.next_registration_check = registration.next_check;
        registration.problem
    }

    /// Whether the kubelet took every served driver. If not, looks again within a second (a
    /// standby agent is ready only then: the pod it replaces may go once it is).
    pub(super) fn all_registered(&mut self) -> bool {
        let all = (self.drivers.values())
            .all(|served| served.plugin.registration_status() == RegistrationStatus::Registered);
        if !all {
            let soon = Instant::now() + Duration::from_secs(1);
            self.next_registration_check =
                Some(self.next_registration_check.map_or(soon, |t| t.min(soon)));
        }
        all
    }

    async fn serve_driver(&self, handler: &str, driver: &str) -> Result<ServedDriver, Error> {
        let options = &self.options;
        let cdi =
            CdiRoot::new(&options.cdi_dir, akri_devices::DRIVER_DOMAIN).map_err(Error::Cdi)?;
        let akri_driver = AkriDriver {
            driver: driver.to_string(),
            cdi_class: handler.to_ascii_lowercase(),
            cdi,
            devices: self.devices.clone(),
        };
        self.metrics.serving(driver);
        let checkpoint = options.state_dir.join(format!("{driver}-checkpoint.json"));
        let timed = Timed {
            inner: akri_driver,
            driver: driver.to_string(),
            metrics: self.metrics.clone(),
        };
        let builder = dra_plugin::Plugin::builder(driver, &options.node_name);
        let builder = match &options.pod_uid {
            Some(uid) => builder.rolling_update(uid),
            None => builder,
        };
        // Both versions, newest first: a reader written for 1.36 (v1alpha1) finds its own.
        let builder = match options.device_metadata {
            true => builder.device_metadata([Version::V1beta1, Version::V1alpha1]),
            false => builder,
        };
        let plugin = builder
            .registry_dir(&options.registry_dir)
            .plugin_dir(options.plugins_dir.join(driver))
            .checkpoint(checkpoint)
            .cdi_dir(&options.cdi_dir)
            .node_uid(&options.node_uid)
            .field_manager(akri_devices::node_field_manager(&options.node_name))
            // Slices changed or deleted behind its back (the kubelet's DRA manager deletes a
            // node's slices when it restarts) are written again as last published; a
            // vanished device's taint moves on at its own time (`next_taint_change`).
            .start(self.client.clone(), timed)
            .await
            .map_err(Error::Plugin)?;
        if let Some(set_aside) = plugin.service().set_aside() {
            let note = format!(
                "The prepared-claims checkpoint of {driver} was unusable ({}); it was moved to {} and the plugin started without it. Claims are prepared again as the kubelet asks.",
                set_aside.reason,
                set_aside.moved_to.display()
            );
            self.warn("CheckpointSetAside", note);
        }
        Ok(ServedDriver {
            plugin,
            vanished: VanishedDevices::new(
                akri_devices::NOT_DISCOVERED_TAINT,
                options.vanished_grace,
                options.device_taints,
            ),
            seeded: false,
            health: Health::default(),
            served_at: Instant::now(),
        })
    }

    fn warn(&self, reason: &'static str, note: String) {
        tokio::spawn(crate::node_events::warn(
            self.client.clone(),
            self.options.node_name.clone(),
            self.options.node_uid.clone(),
            reason,
            note,
        ));
    }
}

/// Sends `driver` on `to` after each change of its prepared claims, until either side goes.
async fn forward_claim_changes(
    mut changes: tokio::sync::watch::Receiver<()>,
    driver: String,
    to: mpsc::UnboundedSender<String>,
) {
    while changes.changed().await.is_ok() {
        if to.send(driver.clone()).is_err() {
            return;
        }
    }
}
