//! The DeviceClasses through which pods ask for devices: one per DiscoveryConfiguration (and
//! its extended resource `akri.sh/<name>`), one per PropertyFilter.

use crate::property_filter::cel_string;
use akri_devices::{ATTR_CONFIGURATION, DRIVER_DOMAIN};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// Label on every DeviceClass this controller writes: the DiscoveryConfiguration it selects from.
pub const CONFIGURATION_LABEL: &str = "akri.sh/configuration";
/// Label on a PropertyFilter's DeviceClass: the filter.
pub const FILTER_LABEL: &str = "akri.sh/property-filter";

/// The extended resource of a configuration: `akri.sh/<name>`, so that
/// `resources.requests: {akri.sh/<name>: N}` is a request for N of its devices.
pub fn extended_resource_name(configuration: &str) -> String {
    format!("{DRIVER_DOMAIN}/{configuration}")
}

/// CEL selecting the devices of a configuration: its driver, and its attribute (one driver
/// serves every configuration of a handler).
pub fn configuration_selector(driver: &str, configuration: &str) -> String {
    let (domain, id) = ATTR_CONFIGURATION
        .split_once('/')
        .expect("attribute names are qualified");
    format!(
        "device.driver == {} && device.attributes[{}][{}] == {}",
        cel_string(driver),
        cel_string(domain),
        cel_string(id),
        cel_string(configuration)
    )
}

/// The DeviceClass of a configuration.
pub fn for_configuration(
    configuration: &str,
    driver: &str,
    owner: OwnerReference,
    extended_resource: bool,
) -> DeviceClass {
    DeviceClass {
        metadata: metadata(
            configuration,
            owner,
            [(CONFIGURATION_LABEL.to_string(), configuration.to_string())],
        ),
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![selector(configuration_selector(
                driver,
                configuration,
            ))]),
            extended_resource_name: extended_resource
                .then(|| extended_resource_name(configuration)),
            ..DeviceClassSpec::default()
        }),
    }
}

/// The DeviceClass of a PropertyFilter: the configuration's selector and the compiled filter.
pub fn for_filter(
    filter: &str,
    configuration: &str,
    driver: &str,
    compiled: &str,
    owner: OwnerReference,
) -> DeviceClass {
    DeviceClass {
        metadata: metadata(
            filter,
            owner,
            [
                (CONFIGURATION_LABEL.to_string(), configuration.to_string()),
                (FILTER_LABEL.to_string(), filter.to_string()),
            ],
        ),
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![
                selector(configuration_selector(driver, configuration)),
                selector(compiled.to_string()),
            ]),
            ..DeviceClassSpec::default()
        }),
    }
}

/// An owner reference making `object` the controller of what we write for it, so that the
/// garbage collector deletes our objects with it.
pub fn owner<K: Resource<DynamicType = ()>>(object: &K) -> Option<OwnerReference> {
    let meta = object.meta();
    Some(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// Why `current` (a DeviceClass of the wanted class's name) is someone else's: it names
/// nobody we write it for as its owner. `None` when it is ours (an owner of the same kind and
/// name; an earlier object of that name counts, since the garbage collector is about to
/// replace it anyway). Forcing our fields onto it would take over an operator's class.
pub fn foreign(current: &DeviceClass, wanted: &DeviceClass) -> Option<String> {
    let name = wanted.metadata.name.as_deref().unwrap_or_default();
    let owner = wanted.metadata.owner_references.as_ref()?.first()?;
    let ours = current.metadata.owner_references.iter().flatten().any(|r| {
        r.api_version == owner.api_version && r.kind == owner.kind && r.name == owner.name
    });
    (!ours).then(|| {
        format!(
            "DeviceClass {name} exists and is not managed by Akri (it has no owner reference to {} {name}), so Akri leaves it alone; rename the {} or delete that DeviceClass",
            owner.kind, owner.kind
        )
    })
}

fn metadata<const N: usize>(
    name: &str,
    owner: OwnerReference,
    labels: [(String, String); N],
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(BTreeMap::from(labels)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    }
}

fn selector(expression: String) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector { expression }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_without_our_owner_is_foreign() {
        let owner = |uid: &str| OwnerReference {
            api_version: "akri.sh/v1".into(),
            kind: "DiscoveryConfiguration".into(),
            name: "cams".into(),
            uid: uid.into(),
            ..OwnerReference::default()
        };
        let wanted = for_configuration("cams", "onvif.akri.sh", owner("new"), true);
        let mut current = DeviceClass::default();
        let why = foreign(&current, &wanted).expect("no owner: foreign");
        assert!(why.contains("not managed by Akri"), "{why}");
        current.metadata.owner_references = Some(vec![owner("old")]);
        assert_eq!(foreign(&current, &wanted), None, "an earlier cams of ours");
    }

    #[test]
    fn configuration_class_selects_driver_and_configuration() {
        let owner = OwnerReference {
            api_version: "akri.sh/v1".into(),
            kind: "DiscoveryConfiguration".into(),
            name: "cams".into(),
            uid: "u".into(),
            ..OwnerReference::default()
        };
        let class = for_configuration("cams", "onvif.akri.sh", owner, true);
        assert_eq!(class.metadata.name.as_deref(), Some("cams"));
        assert_eq!(
            class.spec.as_ref().unwrap().selectors.clone().unwrap()[0]
                .cel
                .as_ref()
                .unwrap()
                .expression,
            r#"device.driver == "onvif.akri.sh" && device.attributes["akri.sh"]["configuration"] == "cams""#
        );
        assert_eq!(
            class
                .spec
                .as_ref()
                .unwrap()
                .extended_resource_name
                .as_deref(),
            Some("akri.sh/cams")
        );
    }
}
