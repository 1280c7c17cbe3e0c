//! This node's discovery handlers, told to the driver-controller through the node's handler
//! Lease ([`akri_devices::handlers`]), so that a configuration naming a handler no node has
//! says so. Applied when the handlers change, never at rest.

use crate::discovery::Handlers;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeSet;

pub(crate) struct HandlerLease {
    api: Api<Lease>,
    node: String,
    params: PatchParams,
    /// The handlers last written; `None` before the first write of this process.
    written: Option<BTreeSet<String>>,
}

impl HandlerLease {
    /// The handler Lease of `node` in `namespace` (the Instances').
    pub fn new(client: kube::Client, namespace: &str, node: &str) -> Self {
        HandlerLease {
            api: Api::namespaced(client, namespace),
            node: node.to_string(),
            params: PatchParams::apply(&akri_devices::node_field_manager(node)).force(),
            written: None,
        }
    }

    /// Applies the Lease if `handlers` are not what it last wrote. A failed write is logged
    /// and tried again on the next pass.
    pub async fn sync(&mut self, handlers: &Handlers) {
        let names: BTreeSet<String> = handlers.keys().cloned().collect();
        if self.written.as_ref() == Some(&names) {
            return;
        }
        let lease = akri_devices::handlers::lease(&self.node, &names);
        let name = akri_devices::handlers::lease_name(&self.node);
        match crate::api_call(self.api.patch(&name, &self.params, &Patch::Apply(&lease))).await {
            Ok(_) => self.written = Some(names),
            Err(error) => {
                tracing::warn!(lease = %name, %error, "telling the driver-controller this node's discovery handlers failed; retrying on the next pass")
            }
        }
    }
}
