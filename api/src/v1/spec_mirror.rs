//! What nodes read of the DiscoveryConfigurations: their specs, mirrored by the
//! driver-controller into ConfigMaps of the Instances' namespace.
//!
//! A watch delivers every write of an object, and a DiscoveryConfiguration's status is written
//! often: the driver-controller's counts and conditions, and every node's own
//! `discoveryErrors` entry. A node reads only the spec (and the name, generation, labels,
//! annotations and deletion), so a node watching DiscoveryConfigurations would hear of every
//! status write of every node: its cost would grow with the cluster. The driver-controller,
//! which watches them anyway, writes one ConfigMap per configuration ([`config_map_name`])
//! holding what nodes read ([`mirrored`]), and writes it again only when that changes; nodes
//! watch those ConfigMaps ([`SPEC_MIRROR_LABEL`]). Once it has mirrored every configuration it
//! writes [`MIRRORED_MARKER`]: a node treats the mirrors as the whole set only then, so that a
//! node upgraded before the driver-controller keeps what it serves instead of taking "no
//! mirror yet" for "no configuration".

use super::DiscoveryConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// Label on the mirror ConfigMaps and the marker (value: `"true"`).
pub const SPEC_MIRROR_LABEL: &str = "akri.sh/discovery-configuration-mirror";

/// Annotation on a mirror ConfigMap: the configuration it mirrors.
pub const SPEC_MIRROR_NAME_ANNOTATION: &str = "akri.sh/discovery-configuration";

/// The ConfigMap the driver-controller writes once every configuration is mirrored.
pub const MIRRORED_MARKER: &str = "discovery-configurations-mirrored";

/// The data key of a mirror: the configuration as JSON, without its status.
pub const SPEC_MIRROR_KEY: &str = "configuration.json";

/// The mirror ConfigMap of configuration `name` (names are at most 52 characters).
pub fn config_map_name(name: &str) -> String {
    format!("discovery-configuration-{name}")
}

/// What a node reads of `config`: name, UID, generation, labels, annotations, creation and
/// deletion times, and the spec; never the status.
pub fn mirrored(config: &DiscoveryConfiguration) -> DiscoveryConfiguration {
    let meta = &config.metadata;
    DiscoveryConfiguration {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            generation: meta.generation,
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            creation_timestamp: meta.creation_timestamp.clone(),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec: config.spec.clone(),
        status: None,
    }
}

/// The mirror's data for `config`.
pub fn data(config: &DiscoveryConfiguration) -> BTreeMap<String, String> {
    let json = serde_json::to_string(&mirrored(config)).expect("a configuration serializes");
    BTreeMap::from([(SPEC_MIRROR_KEY.to_string(), json)])
}

/// The configurations `config_maps` mirror, or `None` while the marker is missing (the
/// driver-controller has not mirrored them all yet). A ConfigMap that does not decode is
/// left out, with why.
pub fn configurations<'a>(
    config_maps: impl IntoIterator<Item = &'a ConfigMap>,
) -> Option<(Vec<DiscoveryConfiguration>, Vec<String>)> {
    let mut marked = false;
    let (mut configs, mut broken) = (Vec::new(), Vec::new());
    for cm in config_maps {
        let name = cm.metadata.name.as_deref().unwrap_or_default();
        if name == MIRRORED_MARKER {
            marked = true;
            continue;
        }
        let json = (cm.data.as_ref()).and_then(|d| d.get(SPEC_MIRROR_KEY));
        match json.map(|j| serde_json::from_str::<DiscoveryConfiguration>(j)) {
            Some(Ok(config)) => configs.push(config),
            Some(Err(error)) => broken.push(format!("ConfigMap {name}: {error}")),
            None => broken.push(format!("ConfigMap {name}: no {SPEC_MIRROR_KEY}")),
        }
    }
    marked.then_some((configs, broken))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> DiscoveryConfiguration {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": {
                "name": name, "uid": "u-1", "generation": 3, "resourceVersion": "77",
                "annotations": { crate::v1::MIGRATED_FROM_ANNOTATION: "site/cams" },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": { "discoveryHandler": { "name": "onvif", "discoveryDetails": "x: 1" } },
            "status": { "instances": 4, "discoveryErrors": [{ "node": "n", "message": "m" }] },
        }))
        .unwrap()
    }

    fn config_map(name: &str, data: Option<BTreeMap<String, String>>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data,
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_mirror_holds_what_nodes_read_and_no_status() {
        let cams = config("cams");
        let (configs, broken) = configurations(&[
            config_map(&config_map_name("cams"), Some(data(&cams))),
            config_map(MIRRORED_MARKER, None),
        ])
        .expect("marked");
        assert!(broken.is_empty(), "{broken:?}");
        let read = &configs[0];
        assert_eq!(read.spec, cams.spec);
        assert_eq!(read.metadata.generation, Some(3));
        assert_eq!(read.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(read.metadata.annotations, cams.metadata.annotations);
        assert_eq!(read.status, None);
        // What changes with every write is not mirrored, so a status write changes nothing.
        assert_eq!(read.metadata.resource_version, None);
        assert_eq!(read.metadata.managed_fields, None);
        let mut written = cams.clone();
        written.status.as_mut().unwrap().instances = 9;
        written.metadata.resource_version = Some("78".into());
        assert_eq!(data(&written), data(&cams));
    }

    #[test]
    fn without_the_marker_the_mirrors_are_not_the_whole_set() {
        let cams = config("cams");
        let mirror = config_map(&config_map_name("cams"), Some(data(&cams)));
        assert!(configurations(std::slice::from_ref(&mirror)).is_none());
        let marker = config_map(MIRRORED_MARKER, None);
        let (configs, _) = configurations(std::slice::from_ref(&marker)).expect("marked");
        assert!(configs.is_empty());
        let broken = config_map("discovery-configuration-bad", None);
        let (configs, broken) = configurations(&[mirror, broken, marker]).unwrap();
        assert_eq!(configs.len(), 1);
        assert_eq!(
            broken,
            ["ConfigMap discovery-configuration-bad: no configuration.json"]
        );
    }
}
