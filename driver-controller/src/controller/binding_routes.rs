//! Binding checks routed to their nodes ([`akri_devices::binding`]): the claims that wait for
//! a node's check go into that node's ConfigMap in the Instances' namespace, which only that
//! node watches. The claims come from the store the controller keeps anyway; each change of
//! one signals [`route`], which writes only the ConfigMaps whose claims changed (one apply,
//! or a delete when a node waits for nothing). What a replica finds at start is taken over:
//! ConfigMaps of nodes that wait for nothing any more are deleted.

use super::Context;
use akri_devices::binding::{
    CHECKS_LABEL, CHECKS_NODE_ANNOTATION, checks_config_map, chosen_node, waiting_results,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Per node, its waiting claims: UID -> `<namespace>/<name>`.
pub(super) type Routes = BTreeMap<String, BTreeMap<String, String>>;

/// The nodes' waiting claims, from `claims`.
pub(super) fn plan<'a>(claims: impl IntoIterator<Item = &'a ResourceClaim>) -> Routes {
    let mut routes = Routes::new();
    for claim in claims {
        if waiting_results(claim).is_empty() {
            continue;
        }
        let (Some(node), Some(uid), Some(namespace), Some(name)) = (
            chosen_node(claim),
            claim.metadata.uid.as_ref(),
            claim.metadata.namespace.as_ref(),
            claim.metadata.name.as_ref(),
        ) else {
            continue;
        };
        routes
            .entry(node.to_string())
            .or_default()
            .insert(uid.clone(), format!("{namespace}/{name}"));
    }
    routes
}

/// Writes the routes each time `changed` says a claim changed, until it ends.
pub(super) async fn route(ctx: Arc<Context>, mut changed: futures::channel::mpsc::Receiver<()>) {
    ctx.stores_listed().await;
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.config.instance_namespace);
    // What earlier replicas wrote: taken as written, so that what is no longer wanted goes.
    let mut written = loop {
        match api.list(&ListParams::default().labels(CHECKS_LABEL)).await {
            Ok(list) => break written_routes(list.items),
            Err(error) => {
                tracing::warn!(%error, "listing the binding-check ConfigMaps failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    };
    loop {
        let wanted = plan(ctx.claims.state().iter().map(|c| c.as_ref()));
        write(&ctx, &api, &wanted, &mut written).await;
        if changed.next().await.is_none() {
            return;
        }
    }
}

/// Writes the ConfigMaps of the nodes whose claims differ between `written` and `wanted`;
/// `written` becomes what was written (a failed write is tried again on the next change).
async fn write(ctx: &Context, api: &Api<ConfigMap>, wanted: &Routes, written: &mut Routes) {
    let empty = BTreeMap::new();
    let nodes: Vec<String> = (wanted.keys().chain(written.keys()))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for node in nodes {
        let claims = wanted.get(&node).unwrap_or(&empty);
        if written.get(&node).unwrap_or(&empty) == claims {
            continue;
        }
        let name = checks_config_map(&node);
        let result = if claims.is_empty() {
            match api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                other => other.map(drop),
            }
        } else {
            let config_map = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "labels": { CHECKS_LABEL: "true" },
                    "annotations": { CHECKS_NODE_ANNOTATION: node },
                },
                "data": claims,
            });
            let params = PatchParams::apply(&ctx.config.field_manager).force();
            api.patch(&name, &params, &Patch::Apply(&config_map))
                .await
                .map(drop)
        };
        match result {
            Ok(()) => {
                let verb = if claims.is_empty() { "delete" } else { "apply" };
                ctx.metrics.wrote("configmap", verb, 1);
                tracing::debug!(%node, claims = claims.len(), "binding checks routed");
                if claims.is_empty() {
                    written.remove(&node);
                } else {
                    written.insert(node, claims.clone());
                }
            }
            Err(error) => {
                tracing::warn!(%node, %error, "routing binding checks to the node failed; retrying on the next claim change")
            }
        }
    }
}

/// The routes the listed ConfigMaps hold.
fn written_routes(config_maps: Vec<ConfigMap>) -> Routes {
    (config_maps.into_iter())
        .filter_map(|cm| {
            let node = cm.metadata.annotations?.remove(CHECKS_NODE_ANNOTATION)?;
            Some((node, cm.data.unwrap_or_default()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use akri_devices::BINDING_CONDITION;

    fn claim(uid: &str, node: &str, binding: bool) -> ResourceClaim {
        let conditions: Vec<&str> = if binding {
            vec![BINDING_CONDITION]
        } else {
            vec![]
        };
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("claim-{uid}"), "namespace": "apps", "uid": uid },
            "spec": {},
            "status": { "allocation": {
                "devices": { "results": [{ "request": "r", "driver": "onvif.akri.sh", "pool": "p",
                    "device": "cam", "bindingConditions": conditions }] },
                "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": [node] }] }] },
            } },
        }))
        .unwrap()
    }

    #[test]
    fn each_waiting_claim_goes_to_its_chosen_node_only() {
        let claims = [
            claim("u1", "edge-1", true),
            claim("u2", "edge-2", true),
            claim("u3", "edge-1", true),
            claim("u4", "edge-3", false),
        ];
        let routes = plan(&claims);
        assert_eq!(
            routes,
            Routes::from([
                (
                    "edge-1".to_string(),
                    BTreeMap::from([
                        ("u1".to_string(), "apps/claim-u1".to_string()),
                        ("u3".to_string(), "apps/claim-u3".to_string()),
                    ])
                ),
                (
                    "edge-2".to_string(),
                    BTreeMap::from([("u2".to_string(), "apps/claim-u2".to_string())])
                ),
            ])
        );
    }
}
