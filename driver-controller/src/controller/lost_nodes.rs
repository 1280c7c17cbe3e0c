//! Lost nodes: not Ready past a grace ([`akri_devices::node_lost`]). Their
//! kubelet-plugins cannot take them out of the Instances they saw, so the shared devices are
//! no longer offered there, and a held device only lost nodes saw is kept tainted like any
//! vanished one. Nothing is written for a lost node itself: it counts again once Ready.
//!
//! A node becomes lost by the clock, not by an event, so the set is looked at every
//! [`CHECK`] and every configuration reconciled when it changes.

use super::Context;
use akri_devices::node_lost;
use kube::ResourceExt;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often the lost nodes are looked for.
const CHECK: Duration = Duration::from_secs(2);

/// Signals `changed` whenever the set of lost nodes changes.
pub(super) async fn watch(ctx: Arc<Context>, mut changed: futures::channel::mpsc::Sender<()>) {
    ctx.stores_listed().await;
    let mut last = ctx.lost_nodes();
    let mut tick = tokio::time::interval(CHECK);
    loop {
        tick.tick().await;
        let lost = ctx.lost_nodes();
        if lost != last {
            tracing::info!(?lost, "the lost nodes changed");
            // Full means a reconcile-all is pending already.
            let _ = changed.try_send(());
            last = lost;
        }
    }
}

impl Context {
    /// The nodes lost now.
    pub(super) fn lost_nodes(&self) -> BTreeSet<String> {
        let now = k8s_openapi::jiff::Timestamp::now();
        self.nodes
            .state()
            .iter()
            .filter(|node| node_lost(node, self.config.node_lost_grace, now))
            .map(|node| node.name_any())
            .collect()
    }
}
