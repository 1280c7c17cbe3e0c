//! The `static` discovery handler: devices a configuration lists by hand, for what no handler
//! can find (a camera that answers no probe and speaks no ONVIF, a PLC on a fieldbus gateway, a
//! serial port a vendor driver made), each with the nodes that reach it. Embedded in the
//! kubelet-plugin (`--embed-handlers=static`), which tells it its node.
//!
//! Discovery details:
//!
//! ```yaml
//! devices:
//!   - id: line-3-plc                     # unique in the configuration
//!     nodes: [edge-1, edge-2]            # the nodes that reach it, by name
//!     properties: {PLC_ADDRESS: "10.1.3.7:502"}
//!     endpoint: tcp://10.1.3.7:502       # optional: what a binding check connects to
//!   - id: scale
//!     nodes: [edge-1]
//!     deviceNodes: [/dev/ttyUSB0]        # the node's own device nodes
//! ```
//!
//! On each node the handler reports the devices that list it, once (the list does not change
//! until the configuration does, and then the agent starts discovery again). The handler is
//! registered as shared: a device several nodes list is one device reached from each, as a
//! network camera is. A device with `deviceNodes` is each listed node's own (the same path on
//! two nodes is two devices): its id on a node is `<id>@<node>`. What a device brings into
//! containers is checked by the agent against the configuration's `containerAccess` like any
//! handler's: with none, only the device is published (its properties as attributes), and
//! `containerAccess` lists the device nodes and property names containers get.

use akri_discovery_handler::{DeviceLists, Discover, proto};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use tonic::Status;

/// The name configurations use.
pub const NAME: &str = "static";
/// Devices are reached from the nodes the configuration lists.
pub const SHARED: bool = true;
/// The property carrying a device's `endpoint`: where a node checks that it reaches the device
/// before a pod is bound to it there (binding conditions).
pub const ENDPOINT_PROPERTY: &str = "STATIC_DEVICE_ENDPOINT";

/// The handler, on one node.
#[derive(Clone, Debug)]
pub struct Static {
    /// This node's name, as configurations list it.
    pub node: String,
}

/// The discovery details.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Details {
    pub devices: Vec<Listed>,
}

/// A device listed by hand.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listed {
    pub id: String,
    pub nodes: Vec<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    #[serde(default)]
    pub device_nodes: Vec<String>,
    /// A URL with a host and a port (`tcp://10.1.3.7:502`, `http://10.1.3.9/`).
    #[serde(default)]
    pub endpoint: Option<String>,
}

impl Listed {
    /// The properties it is reported with: its own, and its endpoint's.
    pub fn properties(&self) -> HashMap<String, String> {
        let mut properties: HashMap<String, String> = self.properties.clone().into_iter().collect();
        if let Some(endpoint) = &self.endpoint {
            properties.insert(ENDPOINT_PROPERTY.to_string(), endpoint.clone());
        }
        properties
    }
}

impl Details {
    /// What is wrong with the list, if anything, in one sentence.
    fn check(&self) -> Result<(), String> {
        if self.devices.is_empty() {
            return Err("devices: list at least one device".into());
        }
        let mut ids = std::collections::BTreeSet::new();
        for device in &self.devices {
            let id = &device.id;
            if id.is_empty()
                || id.len() > 200
                || id.contains('@')
                || id.chars().any(char::is_control)
            {
                return Err(format!(
                    "device id {id:?}: 1 to 200 characters, no '@' or control characters"
                ));
            }
            if !ids.insert(id) {
                return Err(format!("device id {id:?} is listed twice"));
            }
            if device.nodes.is_empty() {
                return Err(format!(
                    "device {id}: nodes lists no node (list the nodes that reach it, by name)"
                ));
            }
            if let Some(path) = (device.device_nodes.iter())
                .find(|p| !p.starts_with("/dev/") || p.split('/').any(|c| c == ".." || c == "."))
            {
                return Err(format!(
                    "device {id}: deviceNodes {path:?}: an absolute path under /dev/ without . or .."
                ));
            }
            if let Some(endpoint) = &device.endpoint {
                let parsed = url::Url::parse(endpoint).ok();
                if !parsed
                    .is_some_and(|u| u.host().is_some() && u.port_or_known_default().is_some())
                {
                    return Err(format!(
                        "device {id}: endpoint {endpoint:?}: a URL with a host and a port, e.g. tcp://10.1.3.7:502"
                    ));
                }
                if device.properties.contains_key(ENDPOINT_PROPERTY) {
                    return Err(format!(
                        "device {id}: property {ENDPOINT_PROPERTY} is its endpoint's: set endpoint"
                    ));
                }
            }
            if let Some(name) = device.properties.keys().find(|n| !is_property_name(n)) {
                return Err(format!(
                    "device {id}: property {name:?}: letters, digits and '_', not starting with a digit"
                ));
            }
        }
        Ok(())
    }

    /// The devices `node` reaches, as the handler reports them there.
    pub fn on(&self, node: &str) -> Vec<proto::Device> {
        (self.devices.iter())
            .filter(|d| d.nodes.iter().any(|n| n == node))
            .map(|d| proto::Device {
                id: match d.device_nodes.is_empty() {
                    true => d.id.clone(),
                    false => format!("{}@{node}", d.id),
                },
                properties: d.properties(),
                mounts: Vec::new(),
                device_specs: (d.device_nodes.iter())
                    .map(|path| proto::DeviceSpec {
                        container_path: path.clone(),
                        host_path: path.clone(),
                        permissions: "rw".into(),
                    })
                    .collect(),
            })
            .collect()
    }
}

/// An environment variable's name: what a property becomes in containers.
fn is_property_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses and checks `discoveryDetails`.
pub fn details(text: &str) -> Result<Details, Status> {
    let details: Details = akri_discovery_handler::details::parse(NAME, text)?;
    details
        .check()
        .map_err(|e| Status::invalid_argument(format!("static discovery details: {e}")))?;
    Ok(details)
}

impl Discover for Static {
    fn start(&self, request: proto::DiscoverRequest, mut lists: DeviceLists) -> Result<(), Status> {
        let devices = details(&request.discovery_details)?.on(&self.node);
        tokio::spawn(async move {
            if lists.send(devices).await {
                lists.closed().await;
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "devices:
- id: line-3-plc
  nodes: [edge-1, edge-2]
  properties: {PLC_ADDRESS: '10.1.3.7:502'}
  endpoint: tcp://10.1.3.7:502
- id: scale
  nodes: [edge-1, edge-3]
  deviceNodes: [/dev/ttyUSB0]
";

    #[test]
    fn each_node_reports_what_lists_it_and_device_nodes_are_its_own() {
        let d = details(TWO).unwrap();
        let on = |node: &str| {
            let mut ids: Vec<String> = d.on(node).into_iter().map(|d| d.id).collect();
            ids.sort();
            ids
        };
        assert_eq!(on("edge-1"), ["line-3-plc", "scale@edge-1"]);
        assert_eq!(on("edge-2"), ["line-3-plc"]);
        assert_eq!(on("edge-3"), ["scale@edge-3"]);
        assert!(on("elsewhere").is_empty());
        let plc = &d.on("edge-2")[0];
        assert_eq!(plc.properties["PLC_ADDRESS"], "10.1.3.7:502");
        assert_eq!(plc.properties[ENDPOINT_PROPERTY], "tcp://10.1.3.7:502");
        assert!(plc.device_specs.is_empty());
        let scale = &d.on("edge-3")[0];
        assert_eq!(scale.device_specs[0].host_path, "/dev/ttyUSB0");
        assert_eq!(scale.device_specs[0].container_path, "/dev/ttyUSB0");
    }

    #[test]
    fn bad_lists_are_refused_saying_what_is_wrong() {
        let error = |text: &str| details(text).unwrap_err().message().to_string();
        for (text, says) in [
            ("devices: []", "list at least one device"),
            ("devices: [{id: a, nodes: []}]", "nodes lists no node"),
            (
                "devices: [{id: a, nodes: [n]}, {id: a, nodes: [m]}]",
                "listed twice",
            ),
            ("devices: [{id: 'a@b', nodes: [n]}]", "no '@'"),
            ("devices: [{id: '', nodes: [n]}]", "1 to 200 characters"),
            (
                "devices: [{id: a, nodes: [n], deviceNodes: [/etc/shadow]}]",
                "under /dev/",
            ),
            (
                "devices: [{id: a, nodes: [n], deviceNodes: [/dev/../etc/shadow]}]",
                "without . or ..",
            ),
            (
                "devices: [{id: a, nodes: [n], properties: {LD-PRELOAD: x}}]",
                "LD-PRELOAD",
            ),
            ("devices: [{id: a, node: [n]}]", "node"),
            (
                "devices: [{id: a, nodes: [n], endpoint: 'tcp://10.1.3.7'}]",
                "a host and a port",
            ),
            (
                "devices: [{id: a, nodes: [n], endpoint: '10.1.3.7:502'}]",
                "a host and a port",
            ),
            ("{}", "devices"),
        ] {
            let message = error(text);
            assert!(
                message.contains(says) && message.starts_with("static"),
                "{text}: {message}"
            );
        }
    }
}
