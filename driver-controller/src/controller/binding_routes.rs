//! Binding checks routed to their nodes ([`akri_devices::binding`]): the claims that wait for
//! a node's check go into that node's ConfigMap in the Instances' namespace, which only that
//! node watches. The claims come from the store the controller keeps anyway; each change of
//! one signals [`route`], which writes only the ConfigMaps whose claims changed (one apply,
//! or a delete when a node waits for nothing). What a replica finds at start is taken over:
//! ConfigMaps of nodes that wait for nothing any more are deleted.
//!
//! A claim whose check failed is deallocated and may be allocated to the same node again. The
//! store may skip the states between (the routing reads it once per burst of changes), and the
//! node's ConfigMap would not change: the node, which checks each routed claim once, would
//! never check the new allocation, and the scheduler would wait for it until its binding
//! timeout. So each claim event is noted ([`Rounds`]): a claim seen not waiting waits anew
//! the next time, and its node's ConfigMap is written without it, then with it.

use super::Context;
use akri_devices::binding::{
    CHECKS_LABEL, CHECKS_NODE_ANNOTATION, checks_config_map, chosen_node, waiting_results,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Per node, its waiting claims by UID.
pub(super) type Routes = BTreeMap<String, BTreeMap<String, Route>>;

/// One claim waiting for a node's check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Route {
    /// `<namespace>/<name>`: what the node's ConfigMap says of it.
    pub claim: String,
    /// Which time it waits ([`Rounds`]); unknown for what a ConfigMap held at start.
    pub round: Option<u64>,
}

/// Per claim that waited, how many times it was seen not waiting since: every event of every
/// claim is noted, so a check that failed (the claim deallocated, then allocated again) shows
/// as a new round even when the store's later state looks like the earlier one.
#[derive(Clone, Default)]
pub(super) struct Rounds(Arc<Mutex<BTreeMap<String, u64>>>);

impl Rounds {
    /// Takes one event of `claim` (the store's slim form).
    pub fn note(&self, claim: &ResourceClaim) {
        let Some(uid) = claim.metadata.uid.as_ref() else {
            return;
        };
        let mut rounds = self.0.lock().expect("lock");
        match waiting_node(claim) {
            Some(_) => {
                rounds.entry(uid.clone()).or_insert(0);
            }
            None => {
                if let Some(round) = rounds.get_mut(uid) {
                    *round += 1;
                }
            }
        }
    }

    fn of(&self, uid: &str) -> u64 {
        *self
            .0
            .lock()
            .expect("lock")
            .entry(uid.to_string())
            .or_insert(0)
    }

    /// Forgets the claims that are gone.
    fn keep(&self, uids: &BTreeSet<&str>) {
        (self.0.lock().expect("lock")).retain(|uid, _| uids.contains(uid.as_str()));
    }
}

/// The node whose check `claim` waits for, if it waits.
fn waiting_node(claim: &ResourceClaim) -> Option<&str> {
    (!waiting_results(claim).is_empty())
        .then(|| chosen_node(claim))
        .flatten()
}

/// The nodes' waiting claims, from `claims`, each in its round of `rounds`.
pub(super) fn plan<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    rounds: &Rounds,
) -> Routes {
    let mut routes = Routes::new();
    for claim in claims {
        let (Some(node), Some(uid), Some(namespace), Some(name)) = (
            waiting_node(claim),
            claim.metadata.uid.as_ref(),
            claim.metadata.namespace.as_ref(),
            claim.metadata.name.as_ref(),
        ) else {
            continue;
        };
        let route = Route {
            claim: format!("{namespace}/{name}"),
            round: Some(rounds.of(uid)),
        };
        routes
            .entry(node.to_string())
            .or_default()
            .insert(uid.clone(), route);
    }
    routes
}

/// What a node's ConfigMap must go through, in order, from `written` to `wanted`: nothing
/// when they name the same claims in the same rounds; first the wanted claims without those
/// that wait anew (the node then forgets their earlier check), then the wanted ones. An empty
/// map is a delete. A round unknown (as found at start) is taken as the current one.
pub(super) fn steps(
    written: &BTreeMap<String, Route>,
    wanted: &BTreeMap<String, Route>,
) -> Vec<BTreeMap<String, Route>> {
    let anew: BTreeSet<&String> = (wanted.iter())
        .filter(|(uid, route)| {
            written
                .get(*uid)
                .is_some_and(|was| match (was.round, route.round) {
                    (Some(was), Some(now)) => was != now,
                    _ => false,
                })
        })
        .map(|(uid, _)| uid)
        .collect();
    let names = |routes: &BTreeMap<String, Route>| -> BTreeMap<String, String> {
        (routes.iter())
            .map(|(uid, route)| (uid.clone(), route.claim.clone()))
            .collect()
    };
    let mut steps = Vec::new();
    if !anew.is_empty() {
        steps.push(
            (wanted.iter())
                .filter(|(uid, _)| !anew.contains(uid))
                .map(|(uid, route)| (uid.clone(), route.clone()))
                .collect(),
        );
    }
    if !anew.is_empty() || names(written) != names(wanted) {
        steps.push(wanted.clone());
    }
    steps
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
        let claims = ctx.claims.state();
        let wanted = plan(claims.iter().map(|c| c.as_ref()), &ctx.binding_rounds);
        let uids = (claims.iter())
            .filter_map(|c| c.metadata.uid.as_deref())
            .collect();
        ctx.binding_rounds.keep(&uids);
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
    let nodes: BTreeSet<String> = (wanted.keys().chain(written.keys())).cloned().collect();
    for node in nodes {
        let claims = wanted.get(&node).unwrap_or(&empty);
        for step in steps(written.get(&node).unwrap_or(&empty), claims) {
            match write_one(ctx, api, &node, &step).await {
                Ok(()) if step.is_empty() => {
                    written.remove(&node);
                }
                Ok(()) => {
                    written.insert(node.clone(), step);
                }
                Err(error) => {
                    tracing::warn!(%node, %error, "routing binding checks to the node failed; retrying on the next claim change");
                    break;
                }
            }
        }
        // A round unknown (as found at start) is the current one from now on.
        if let (Some(was), Some(now)) = (written.get_mut(&node), wanted.get(&node)) {
            for (uid, route) in was.iter_mut().filter(|(_, r)| r.round.is_none()) {
                route.round = now.get(uid).and_then(|r| r.round);
            }
        }
    }
}

/// Writes `node`'s ConfigMap with `claims`, or deletes it when there are none.
async fn write_one(
    ctx: &Context,
    api: &Api<ConfigMap>,
    node: &str,
    claims: &BTreeMap<String, Route>,
) -> Result<(), kube::Error> {
    let name = checks_config_map(node);
    if claims.is_empty() {
        match api.delete(&name, &DeleteParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => other.map(drop)?,
        }
        ctx.metrics.wrote("configmap", "delete", 1);
    } else {
        let data: BTreeMap<&String, &String> = (claims.iter())
            .map(|(uid, route)| (uid, &route.claim))
            .collect();
        let config_map = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": { CHECKS_LABEL: "true" },
                "annotations": { CHECKS_NODE_ANNOTATION: node },
            },
            "data": data,
        });
        let params = PatchParams::apply(&ctx.config.field_manager).force();
        api.patch(&name, &params, &Patch::Apply(&config_map))
            .await?;
        ctx.metrics.wrote("configmap", "apply", 1);
    }
    tracing::debug!(%node, claims = claims.len(), "binding checks routed");
    Ok(())
}

/// The routes the listed ConfigMaps hold, in rounds unknown.
fn written_routes(config_maps: Vec<ConfigMap>) -> Routes {
    (config_maps.into_iter())
        .filter_map(|cm| {
            let node = cm.metadata.annotations?.remove(CHECKS_NODE_ANNOTATION)?;
            let routes = (cm.data.unwrap_or_default().into_iter())
                .map(|(uid, claim)| (uid, Route { claim, round: None }))
                .collect();
            Some((node, routes))
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

    fn unallocated(uid: &str) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("claim-{uid}"), "namespace": "apps", "uid": uid },
            "spec": {},
        }))
        .unwrap()
    }

    fn names(routes: &BTreeMap<String, Route>) -> Vec<(&str, &str)> {
        (routes.iter())
            .map(|(uid, r)| (uid.as_str(), r.claim.as_str()))
            .collect()
    }

    #[test]
    fn each_waiting_claim_goes_to_its_chosen_node_only() {
        let claims = [
            claim("u1", "edge-1", true),
            claim("u2", "edge-2", true),
            claim("u3", "edge-1", true),
            claim("u4", "edge-3", false),
        ];
        let routes = plan(&claims, &Rounds::default());
        let nodes: Vec<(&str, Vec<(&str, &str)>)> = (routes.iter())
            .map(|(node, claims)| (node.as_str(), names(claims)))
            .collect();
        assert_eq!(
            nodes,
            [
                (
                    "edge-1",
                    vec![("u1", "apps/claim-u1"), ("u3", "apps/claim-u3")]
                ),
                ("edge-2", vec![("u2", "apps/claim-u2")]),
            ]
        );
    }

    /// The flake of `binding::a_shared_device_binds_only_on_a_node_that_reaches_it`: the check
    /// failed, the scheduler deallocated and allocated to the same node again, and the store
    /// held the same state before and after. The routes alone were equal (no write, the node
    /// never checked again); the rounds noted from every event tell the two apart.
    #[test]
    fn a_claim_allocated_again_to_the_same_node_is_routed_anew() {
        let rounds = Rounds::default();
        let (u1, u2) = (claim("u1", "edge-1", true), claim("u2", "edge-1", true));
        rounds.note(&u1);
        rounds.note(&u2);
        let written = plan([&u1, &u2], &rounds).remove("edge-1").unwrap();
        // u1's check failed: deallocated, then allocated to edge-1 again.
        rounds.note(&claim("u1", "edge-1", false));
        rounds.note(&unallocated("u1"));
        rounds.note(&u1);
        let wanted = plan([&u1, &u2], &rounds).remove("edge-1").unwrap();
        assert_eq!(names(&written), names(&wanted), "the store looks the same");
        let written_then = steps(&written, &wanted);
        assert_eq!(
            written_then.iter().map(names).collect::<Vec<_>>(),
            [
                vec![("u2", "apps/claim-u2")],
                vec![("u1", "apps/claim-u1"), ("u2", "apps/claim-u2")],
            ],
            "u1 goes, then comes back"
        );

        // Alone on its node: the ConfigMap is deleted (an empty step), then written again.
        let alone = plan([&u1], &rounds).remove("edge-1").unwrap();
        rounds.note(&unallocated("u1"));
        rounds.note(&u1);
        let again = plan([&u1], &rounds).remove("edge-1").unwrap();
        let written_then = steps(&alone, &again);
        assert_eq!(written_then.len(), 2);
        assert!(written_then[0].is_empty() && written_then[1] == again);
    }

    #[test]
    fn the_same_claims_in_the_same_rounds_are_not_written_again() {
        let rounds = Rounds::default();
        let u1 = claim("u1", "edge-1", true);
        rounds.note(&u1);
        let written = plan([&u1], &rounds).remove("edge-1").unwrap();
        // Events that leave it waiting (another status write) start no round.
        rounds.note(&u1);
        let wanted = plan([&u1], &rounds).remove("edge-1").unwrap();
        assert!(steps(&written, &wanted).is_empty());
        // A claim added or gone is one write.
        let u2 = claim("u2", "edge-1", true);
        let more = plan([&u1, &u2], &rounds).remove("edge-1").unwrap();
        assert_eq!(steps(&wanted, &more), std::slice::from_ref(&more));
        assert_eq!(steps(&more, &BTreeMap::new()), [BTreeMap::new()]);
    }

    #[test]
    fn routes_found_at_start_are_taken_in_their_current_round() {
        let found = written_routes(vec![
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "checks", "annotations": { CHECKS_NODE_ANNOTATION: "edge-1" } },
                "data": { "u1": "apps/claim-u1" },
            }))
            .unwrap(),
        ]);
        let rounds = Rounds::default();
        let u1 = claim("u1", "edge-1", true);
        rounds.note(&unallocated("u1"));
        rounds.note(&u1);
        let wanted = plan([&u1], &rounds).remove("edge-1").unwrap();
        assert_eq!(found["edge-1"]["u1"].round, None);
        assert!(steps(&found["edge-1"], &wanted).is_empty());
    }

    #[test]
    fn rounds_of_claims_gone_are_forgotten() {
        let rounds = Rounds::default();
        rounds.note(&claim("u1", "edge-1", true));
        rounds.note(&claim("u2", "edge-1", true));
        rounds.note(&unallocated("u1"));
        rounds.keep(&BTreeSet::from(["u2"]));
        assert_eq!(
            rounds.0.lock().unwrap().clone(),
            BTreeMap::from([("u2".to_string(), 0)])
        );
    }
}
