//! The DiscoveryConfigurations' specs, mirrored into ConfigMaps of the Instances' namespace
//! for the nodes ([`akri_api::v1::spec_mirror`]): a node then hears of a spec change and of
//! no status write, whatever the number of nodes writing status.
//!
//! It reads two stores (the configurations, the reconciler's, and the mirrors it wrote), plans
//! from them with [`plan`] (pure) after each change, and writes only what differs: one
//! server-side apply per changed configuration, one delete per configuration gone, and the
//! marker once. Each mirror
//! is owned by its configuration, so the garbage collector removes it with the configuration
//! even while no replica runs.

use crate::metrics::Metrics;
use akri_api::v1::DiscoveryConfiguration;
use akri_api::v1::spec_mirror::{
    MIRRORED_MARKER, SPEC_MIRROR_LABEL, SPEC_MIRROR_NAME_ANNOTATION, config_map_name, data,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self as reflect, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One write the mirrors need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Apply configuration `configuration`'s mirror with `data`.
    Apply {
        configuration: String,
        uid: String,
        data: BTreeMap<String, String>,
    },
    /// Delete the mirror ConfigMap of this name: its configuration is gone.
    Delete(String),
    /// Write the marker: every configuration is mirrored.
    Mark,
}

/// What to write so that `stored` (the mirrors and the marker, by ConfigMap name) mirrors
/// `configs`. The marker comes last, once everything else is written.
pub fn plan(
    configs: &[Arc<DiscoveryConfiguration>],
    stored: &BTreeMap<String, Option<BTreeMap<String, String>>>,
) -> Vec<Write> {
    let mut writes = Vec::new();
    let mut wanted = std::collections::BTreeSet::new();
    for config in configs {
        let (Some(name), Some(uid)) = (&config.metadata.name, &config.metadata.uid) else {
            continue;
        };
        let cm = config_map_name(name);
        let data = data(config);
        if stored.get(&cm) != Some(&Some(data.clone())) {
            writes.push(Write::Apply {
                configuration: name.clone(),
                uid: uid.clone(),
                data,
            });
        }
        wanted.insert(cm);
    }
    for cm in stored.keys() {
        if cm != MIRRORED_MARKER && !wanted.contains(cm) {
            writes.push(Write::Delete(cm.clone()));
        }
    }
    if !stored.contains_key(MIRRORED_MARKER) {
        writes.push(Write::Mark);
    }
    writes
}

/// Keeps the mirrors in `namespace` with a watch of the configurations of its own, until the
/// watches end, writing as `field_manager`: the mirror writer alone (tests, tools). The
/// driver-controller runs [`keep`] on its reconciler's store instead.
pub async fn run(client: kube::Client, namespace: String, field_manager: String, metrics: Metrics) {
    let (configs, writer) = reflect::store::<DiscoveryConfiguration>();
    let changes = reflect::reflector(
        writer,
        watcher(Api::all(client.clone()), watcher::Config::default()).default_backoff(),
    )
    .map(drop);
    keep(configs, changes, client, namespace, field_manager, metrics).await
}

/// Keeps the mirrors in `namespace` of the configurations in `configs`, a store another watch
/// fills, planning again on each of `changes` (one per event of that watch) and each change
/// of the mirrors; until the watches end, writing as `field_manager`.
pub async fn keep(
    configs: Store<DiscoveryConfiguration>,
    changes: impl futures::Stream<Item = ()> + Send,
    client: kube::Client,
    namespace: String,
    field_manager: String,
    metrics: Metrics,
) {
    let (mirrors, mirrors_writer) = reflect::store::<ConfigMap>();
    let api = Api::<ConfigMap>::namespaced(client, &namespace);
    // Each event says whether it ended a list of the mirrors.
    let mirror_config = watcher::Config::default().labels(SPEC_MIRROR_LABEL);
    let mirror_events = reflect::reflector(
        mirrors_writer,
        watcher(api.clone(), mirror_config).default_backoff(),
    )
    .map(|e| matches!(e, Ok(watcher::Event::InitDone)));
    let changes = changes.map(|()| false);
    let mut events = std::pin::pin!(futures::stream::select(changes, mirror_events));
    let mut mirrors_listed = false;
    let params = PatchParams::apply(&field_manager).force();
    while let Some(mut listed) = events.next().await {
        // This change and every one already waiting with it.
        loop {
            mirrors_listed |= listed;
            match futures::FutureExt::now_or_never(events.next()) {
                Some(Some(next)) => listed = next,
                _ => break,
            }
        }
        // Before both first lists, a configuration not seen yet would look gone.
        if !(akri_runtime::listed(&configs) && mirrors_listed) {
            continue;
        }
        for write in plan(&configs.state(), &stored(&mirrors)) {
            apply(&api, &params, &metrics, write).await;
        }
    }
}

/// The stored mirrors' data by ConfigMap name.
fn stored(mirrors: &Store<ConfigMap>) -> BTreeMap<String, Option<BTreeMap<String, String>>> {
    (mirrors.state().iter())
        .filter_map(|cm| Some((cm.metadata.name.clone()?, cm.data.clone())))
        .collect()
}

/// Does one write; a failed one is logged and tried again on the next change.
async fn apply(api: &Api<ConfigMap>, params: &PatchParams, metrics: &Metrics, write: Write) {
    let (verb, name, result) = match write {
        Write::Apply {
            configuration,
            uid,
            data,
        } => {
            let name = config_map_name(&configuration);
            let config_map = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "labels": { SPEC_MIRROR_LABEL: "true" },
                    "annotations": { SPEC_MIRROR_NAME_ANNOTATION: configuration },
                    "ownerReferences": [{
                        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                        "name": configuration, "uid": uid,
                    }],
                },
                "data": data,
            });
            let result = api.patch(&name, params, &Patch::Apply(&config_map)).await;
            ("apply", name, result.map(drop))
        }
        Write::Delete(name) => {
            let result = match api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                other => other.map(drop),
            };
            ("delete", name, result)
        }
        Write::Mark => {
            let marker = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": MIRRORED_MARKER, "labels": { SPEC_MIRROR_LABEL: "true" } },
            });
            let result = api
                .patch(MIRRORED_MARKER, params, &Patch::Apply(&marker))
                .await;
            ("apply", MIRRORED_MARKER.to_string(), result.map(drop))
        }
    };
    match result {
        Ok(()) => metrics.wrote("configmap", verb, 1),
        Err(error) => {
            tracing::warn!(config_map = %name, %error, "mirroring a DiscoveryConfiguration's spec failed; retrying on the next change")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, details: &str, instances: i64) -> Arc<DiscoveryConfiguration> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name, "uid": format!("uid-{name}"), "generation": 1 },
                "spec": { "discoveryHandler": { "name": "onvif", "discoveryDetails": details } },
                "status": { "instances": instances },
            }))
            .unwrap(),
        )
    }

    fn kinds(writes: &[Write]) -> Vec<String> {
        (writes.iter())
            .map(|w| match w {
                Write::Apply { configuration, .. } => format!("apply {configuration}"),
                Write::Delete(name) => format!("delete {name}"),
                Write::Mark => "mark".into(),
            })
            .collect()
    }

    #[test]
    fn the_mirrors_follow_specs_not_status() {
        let cams = config("cams", "a: 1", 0);
        let usb = config("usb", "", 0);
        let mut stored = BTreeMap::new();

        // Nothing mirrored yet: every configuration, then the marker.
        let first = plan(&[cams.clone(), usb.clone()], &stored);
        assert_eq!(kinds(&first), ["apply cams", "apply usb", "mark"]);
        for write in first {
            match write {
                Write::Apply {
                    configuration,
                    data,
                    ..
                } => stored.insert(config_map_name(&configuration), Some(data)),
                Write::Mark => stored.insert(MIRRORED_MARKER.to_string(), None),
                Write::Delete(_) => unreachable!(),
            };
        }

        // At rest, and after a status-only write: nothing.
        assert!(plan(&[cams.clone(), usb.clone()], &stored).is_empty());
        let counted = config("cams", "a: 1", 7);
        assert!(plan(&[counted, usb.clone()], &stored).is_empty());

        // A spec change: that one; a configuration gone: its mirror.
        let changed = config("cams", "a: 2", 7);
        assert_eq!(
            kinds(&plan(&[changed, usb.clone()], &stored)),
            ["apply cams"]
        );
        assert_eq!(
            kinds(&plan(&[usb], &stored)),
            ["delete discovery-configuration-cams"]
        );
    }
}
