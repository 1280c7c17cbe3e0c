//! The start-up gate of the node agent.

use crate::discovery::RegisteredHandler;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Holds back a (re)started agent's first publication.
///
/// The slices, Instances and health of a node describe what its discovery handlers reported
/// to the previous process. Publishing before this process heard the same again would
/// withdraw every device for a moment (a new slice generation, Instances deleted and
/// recreated, allocations failing meanwhile). So nothing is written until the configurations
/// are listed and each one whose handler is registered has reported its devices once, or until
/// the start-up wait is over (a handler that never answers must not freeze the node forever).
/// The configurations being listed is never waived: without them every device would go.
pub struct StartupGate {
    deadline: tokio::time::Instant,
    listed: bool,
    said_unlisted: bool,
    answered: BTreeSet<String>,
    open: bool,
}

impl StartupGate {
    pub fn new(wait: Duration) -> Self {
        StartupGate {
            deadline: tokio::time::Instant::now() + wait,
            listed: false,
            said_unlisted: false,
            answered: BTreeSet::new(),
            open: false,
        }
    }

    pub fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    pub fn configs_listed(&mut self) {
        self.listed = true;
    }

    /// Whether the configurations were listed (what is not among them is not wanted).
    pub fn listed(&self) -> bool {
        self.listed
    }

    pub fn answered(&mut self, configuration: &str) {
        if !self.open {
            self.answered.insert(configuration.to_string());
        }
    }

    /// Whether publishing may start (once open, it stays open). `configs`: each
    /// configuration's key (as [`answered`](Self::answered) gets it), name and handler.
    pub fn open<'a>(
        &mut self,
        configs: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
        handlers: &BTreeMap<String, RegisteredHandler>,
    ) -> bool {
        if self.open {
            return true;
        }
        let waiting: Vec<&str> = configs
            .into_iter()
            .filter(|(_, _, handler)| handlers.contains_key(*handler))
            // A configuration the agent refuses to run never answers.
            .filter(|(_, name, _)| akri_devices::validate_configuration_name(name).is_ok())
            .map(|(key, _, _)| key)
            .filter(|key| !self.answered.contains(*key))
            .collect();
        if self.listed && waiting.is_empty() {
            tracing::info!("discovery answered for every configuration; publishing");
        } else if !self.listed {
            // Without the configurations, publishing would withdraw every device of the node:
            // the wait for them has no end.
            if self.remaining().is_zero() && !self.said_unlisted {
                tracing::warn!(
                    "the configurations are not listed yet (DiscoveryConfigurations: not mirrored by the driver-controller yet); the node's devices stay as published until they are"
                );
                self.said_unlisted = true;
            }
            return false;
        } else if self.remaining().is_zero() {
            tracing::warn!(
                configurations_listed = self.listed,
                ?waiting,
                "start-up wait over before discovery answered; publishing what is known"
            );
        } else {
            return false;
        }
        self.open = true;
        self.answered.clear();
        true
    }
}
