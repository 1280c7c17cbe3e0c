//! The device inventory for people (`kubectl akri devices`): one row per Instance, with its
//! configuration, the nodes that reach it, its state and the claims and pods that hold it.
//!
//! Read from what the cluster already keeps, nothing of ours in between: the Instances (the
//! nodes' word), the ResourceSlices of the `*.akri.sh` drivers (what is published, and its
//! device taints) and the ResourceClaims whose allocations name those devices (who holds
//! them, and for which pods). [`read`] lists them; [`rows`] joins them (pure, tested apart);
//! [`table`] prints them as kubectl prints its tables.

use akri_api::v1::Instance;
use akri_devices::{ATTR_CONFIGURATION, ATTR_INSTANCE, DRIVER_DOMAIN, NOT_DISCOVERED_TAINT};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use std::collections::{BTreeMap, BTreeSet};

/// Errors of reading the cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("list {what}: {cause}")]
    List {
        what: &'static str,
        cause: kube::Error,
    },
}

/// What the inventory is made of, as read.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub instances: Vec<Instance>,
    pub slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
}

/// One device (an Instance) as people ask about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub configuration: String,
    pub instance: String,
    /// The nodes that reach it, as its Instance lists them.
    pub nodes: Vec<String>,
    /// `ok`, `not published` (no DRA device: legacy mode, or not yet), or the taints of its
    /// DRA devices (`not discovered (NoExecute)`: it vanished while a claim holds it).
    pub state: String,
    /// The claims allocated its DRA devices, `<namespace>/<name>`.
    pub claims: Vec<String>,
    /// The pods those claims are reserved for, `<namespace>/<name>`.
    pub pods: Vec<String>,
}

/// Lists what the inventory is made of: the Instances in `namespace` (the chart's release
/// namespace), every ResourceSlice and every ResourceClaim.
pub async fn read(client: &kube::Client, namespace: &str) -> Result<Snapshot, Error> {
    let list = ListParams::default();
    let instances = Api::<Instance>::namespaced(client.clone(), namespace)
        .list(&list)
        .await
        .map_err(|cause| Error::List {
            what: "Instances",
            cause,
        })?;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&list)
        .await
        .map_err(|cause| Error::List {
            what: "ResourceSlices",
            cause,
        })?;
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&list)
        .await
        .map_err(|cause| Error::List {
            what: "ResourceClaims",
            cause,
        })?;
    Ok(Snapshot {
        instances: instances.items,
        slices: slices.items,
        claims: claims.items,
    })
}

/// A published device: driver, pool, name.
type DeviceKey = (String, String, String);

/// What one device (Instance) is made of, gathered from the three kinds.
#[derive(Default)]
struct Gathered {
    configuration: String,
    nodes: BTreeSet<String>,
    /// Its published DRA devices (one, or one per slot).
    published: usize,
    taints: BTreeSet<String>,
    claims: BTreeSet<String>,
    pods: BTreeSet<String>,
}

/// The inventory's rows, by configuration and Instance name. Besides the Instances: a device
/// still published without its Instance (it vanished while a claim holds it, and its node let
/// the Instance go), from its slice; and a device a claim was allocated that is published no
/// more, named as the allocation names it, its configuration the class its request asked for.
pub fn rows(snapshot: &Snapshot) -> Vec<Row> {
    let mut gathered: BTreeMap<String, Gathered> = BTreeMap::new();
    let mut instance_of: BTreeMap<DeviceKey, String> = BTreeMap::new();
    for instance in &snapshot.instances {
        let entry = gathered
            .entry(instance.metadata.name.clone().unwrap_or_default())
            .or_default();
        entry.configuration = instance.spec.configuration_name.clone();
        entry.nodes = instance.spec.nodes.iter().cloned().collect();
    }
    let ours = format!(".{DRIVER_DOMAIN}");
    for slice in &snapshot.slices {
        let spec = &slice.spec;
        if !spec.driver.ends_with(&ours) {
            continue;
        }
        for device in spec.devices.iter().flatten() {
            let attribute = |name: &str| {
                (device.attributes.as_ref())
                    .and_then(|a| a.get(name))
                    .and_then(|a| a.string.clone())
            };
            let Some(instance) = attribute(ATTR_INSTANCE) else {
                continue;
            };
            let key = (
                spec.driver.clone(),
                spec.pool.name.clone(),
                device.name.clone(),
            );
            instance_of.insert(key, instance.clone());
            let entry = gathered.entry(instance).or_default();
            entry.published += 1;
            if entry.configuration.is_empty() {
                // No Instance: what the slice says.
                entry.configuration = attribute(ATTR_CONFIGURATION).unwrap_or_default();
                entry
                    .nodes
                    .extend(device.node_name.clone().or(spec.node_name.clone()));
            }
            for taint in device.taints.iter().flatten() {
                entry.taints.insert(match taint.key.as_str() {
                    NOT_DISCOVERED_TAINT => format!("not discovered ({})", taint.effect),
                    other => format!("{other} ({})", taint.effect),
                });
            }
        }
    }
    for claim in &snapshot.claims {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = format!(
            "{namespace}/{}",
            claim.metadata.name.clone().unwrap_or_default()
        );
        let status = claim.status.as_ref();
        let results = (status.and_then(|s| s.allocation.as_ref()))
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        let pods: Vec<String> = (status.and_then(|s| s.reserved_for.as_ref()))
            .into_iter()
            .flatten()
            .filter(|c| c.resource == "pods")
            .map(|c| format!("{namespace}/{}", c.name))
            .collect();
        for result in results.iter().filter(|r| r.driver.ends_with(&ours)) {
            let key = (
                result.driver.clone(),
                result.pool.clone(),
                result.device.clone(),
            );
            let instance = instance_of
                .get(&key)
                .cloned()
                .unwrap_or(result.device.clone());
            let entry = gathered.entry(instance).or_default();
            if entry.configuration.is_empty() {
                entry.configuration = requested_class(claim, &result.request).unwrap_or_default();
            }
            entry.claims.insert(name.clone());
            entry.pods.extend(pods.iter().cloned());
        }
    }
    let mut rows: Vec<Row> = (gathered.into_iter())
        .map(|(instance, g)| Row {
            configuration: g.configuration,
            instance,
            nodes: g.nodes.into_iter().collect(),
            state: match (g.published, g.taints.is_empty()) {
                (0, _) => "not published".to_string(),
                (_, true) => "ok".to_string(),
                (_, false) => g.taints.into_iter().collect::<Vec<_>>().join(", "),
            },
            claims: g.claims.into_iter().collect(),
            pods: g.pods.into_iter().collect(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.configuration, &a.instance).cmp(&(&b.configuration, &b.instance)));
    rows
}

/// The device class a claim's request (`req`, or a subrequest `req/sub`) asked for: a
/// configuration's DeviceClass has its name.
fn requested_class(claim: &ResourceClaim, request: &str) -> Option<String> {
    let (base, sub) = match request.split_once('/') {
        Some((base, sub)) => (base, Some(sub)),
        None => (request, None),
    };
    let request = (claim.spec.as_ref().and_then(|s| s.devices.as_ref()))
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .find(|r| r.name == base)?;
    match sub {
        None => Some(request.exactly.as_ref()?.device_class_name.clone()),
        Some(sub) => (request.first_available.iter().flatten())
            .find(|s| s.name == sub)
            .map(|s| s.device_class_name.clone()),
    }
}

/// The header of [`table`].
pub const HEADER: [&str; 6] = [
    "CONFIGURATION",
    "INSTANCE",
    "NODES",
    "STATE",
    "CLAIMS",
    "PODS",
];

/// The rows as kubectl prints a table: a header, columns three spaces apart, lists joined by
/// commas, `<none>` for an empty one.
pub fn table(rows: &[Row]) -> String {
    let list = |items: &[String]| match items.is_empty() {
        true => "<none>".to_string(),
        false => items.join(","),
    };
    let mut lines: Vec<[String; 6]> = vec![HEADER.map(str::to_string)];
    for row in rows {
        lines.push([
            row.configuration.clone(),
            row.instance.clone(),
            list(&row.nodes),
            row.state.clone(),
            list(&row.claims),
            list(&row.pods),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = (line.iter().zip(&widths))
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, Device, DeviceAllocationResult, DeviceAttribute,
        DeviceRequestAllocationResult, DeviceTaint, ResourceClaimConsumerReference,
        ResourceClaimStatus, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn instance(name: &str, configuration: &str, nodes: &[&str]) -> Instance {
        Instance {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: akri_api::v0::InstanceSpec {
                configuration_name: configuration.into(),
                cdi_name: String::new(),
                capacity: 1,
                broker_properties: Default::default(),
                shared: nodes.len() > 1,
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                device_usage: Default::default(),
            },
        }
    }

    fn slice(driver: &str, pool: &str, devices: &[(&str, &str, Option<&str>)]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta::default(),
            spec: ResourceSliceSpec {
                driver: driver.into(),
                pool: ResourcePool {
                    name: pool.into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(
                    (devices.iter())
                        .map(|(name, instance, taint)| Device {
                            name: name.to_string(),
                            attributes: Some(BTreeMap::from([
                                (ATTR_INSTANCE.to_string(), string(instance)),
                                (
                                    ATTR_CONFIGURATION.to_string(),
                                    string(instance.split('-').next().unwrap()),
                                ),
                            ])),
                            taints: taint.map(|effect| {
                                vec![DeviceTaint {
                                    key: NOT_DISCOVERED_TAINT.into(),
                                    effect: effect.into(),
                                    ..Default::default()
                                }]
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                // A node's own pool is named after the node.
                node_name: pool.starts_with("edge").then(|| pool.to_string()),
                ..Default::default()
            },
        }
    }

    fn string(value: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(value.to_string()),
            ..Default::default()
        }
    }

    fn claim(
        namespace: &str,
        name: &str,
        device: (&str, &str, &str),
        pods: &[&str],
    ) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            // A configuration's class is named after it, as is its Instances' prefix.
            spec: serde_json::from_value(serde_json::json!({ "devices": { "requests": [
                { "name": "req", "exactly": { "deviceClassName": device.2.split('-').next() } },
            ] } }))
            .unwrap(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            driver: device.0.into(),
                            pool: device.1.into(),
                            device: device.2.into(),
                            request: "req".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                reserved_for: Some(
                    (pods.iter())
                        .map(|p| ResourceClaimConsumerReference {
                            resource: "pods".into(),
                            name: p.to_string(),
                            uid: format!("uid-{p}"),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn each_instance_with_its_state_claims_and_pods() {
        let snapshot = Snapshot {
            instances: vec![
                instance("cams-bbbbbb", "cams", &["edge-1", "edge-2"]),
                instance("cams-aaaaaa", "cams", &["edge-1"]),
                instance("usb-cccccc", "usb", &["edge-2"]),
                instance("legacy-dddddd", "legacy", &["edge-1"]),
            ],
            slices: vec![
                slice(
                    "onvif.akri.sh",
                    "cams",
                    &[("cams-aaaaaa", "cams-aaaaaa", None)],
                ),
                slice(
                    "onvif.akri.sh",
                    "cams-bbbbbb",
                    &[("cams-bbbbbb", "cams-bbbbbb", Some("NoExecute"))],
                ),
                slice(
                    "udev.akri.sh",
                    "edge-2",
                    &[("usb-cccccc", "usb-cccccc", None)],
                ),
                // Vanished while held, its Instance gone: still shown, from its slice.
                slice(
                    "udev.akri.sh",
                    "edge-3",
                    &[("usb-eeeeee", "usb-eeeeee", Some("NoSchedule"))],
                ),
                // Another driver's device of the same name is not ours.
                slice(
                    "gpu.example.com",
                    "edge-2",
                    &[("usb-cccccc", "usb-cccccc", None)],
                ),
            ],
            claims: vec![
                claim(
                    "apps",
                    "door",
                    ("onvif.akri.sh", "cams", "cams-aaaaaa"),
                    &["door-1"],
                ),
                claim(
                    "apps",
                    "gate",
                    ("onvif.akri.sh", "cams-bbbbbb", "cams-bbbbbb"),
                    &[],
                ),
                claim(
                    "ml",
                    "gpu",
                    ("gpu.example.com", "edge-2", "usb-cccccc"),
                    &["train"],
                ),
                // Allocated a device published no more (its node lost it before it was prepared).
                claim(
                    "apps",
                    "old",
                    ("onvif.akri.sh", "cams", "cams-ffffff"),
                    &["old-1"],
                ),
                claim(
                    "lab",
                    "scale",
                    ("udev.akri.sh", "edge-3", "usb-eeeeee"),
                    &["weigh"],
                ),
            ],
        };
        let rows = rows(&snapshot);
        let by_name: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.instance.as_str(), r)).collect();
        assert_eq!(
            rows.iter().map(|r| r.instance.as_str()).collect::<Vec<_>>(),
            [
                "cams-aaaaaa",
                "cams-bbbbbb",
                "cams-ffffff",
                "legacy-dddddd",
                "usb-cccccc",
                "usb-eeeeee"
            ]
        );
        let door = by_name["cams-aaaaaa"];
        assert_eq!(
            (door.state.as_str(), door.claims.clone(), door.pods.clone()),
            (
                "ok",
                vec!["apps/door".to_string()],
                vec!["apps/door-1".to_string()]
            )
        );
        let gate = by_name["cams-bbbbbb"];
        assert_eq!(gate.state, "not discovered (NoExecute)");
        assert_eq!(gate.nodes, ["edge-1", "edge-2"]);
        assert!(gate.pods.is_empty());
        assert_eq!(by_name["legacy-dddddd"].state, "not published");
        let usb = by_name["usb-cccccc"];
        assert!(usb.claims.is_empty(), "the other driver's claim: {usb:?}");

        let printed = table(&rows);
        assert_eq!(
            printed,
            "\
CONFIGURATION   INSTANCE        NODES           STATE                         CLAIMS      PODS
cams            cams-aaaaaa     edge-1          ok                            apps/door   apps/door-1
cams            cams-bbbbbb     edge-1,edge-2   not discovered (NoExecute)    apps/gate   <none>
cams            cams-ffffff     <none>          not published                 apps/old    apps/old-1
legacy          legacy-dddddd   edge-1          not published                 <none>      <none>
usb             usb-cccccc      edge-2          ok                            <none>      <none>
usb             usb-eeeeee      edge-3          not discovered (NoSchedule)   lab/scale   lab/weigh
"
        );
        // The user guide shows this table as printed.
        let guide = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/user-guide.md"),
        )
        .unwrap();
        assert!(
            guide.contains(&format!("```text\n{printed}```")),
            "docs/user-guide.md does not show the table as printed:\n{printed}"
        );
    }
}
