//! `akri.sh/v1`: the DRA path.
//!
//! The seed design split Akri's v0 `Configuration` in two: *what to discover*
//! ([`DiscoveryConfiguration`]) and *what to run next to each device* ([`BrokerTemplate`]);
//! [`PropertyFilter`] narrows a request to devices whose discovered properties match.
//!
//! ## Scope
//! `DiscoveryConfiguration` and `PropertyFilter` are **cluster-scoped**: each becomes a
//! cluster-scoped DeviceClass of the same name (and `akri.sh/<name>` extended resource), so
//! their names must be unique in the cluster, and a namespaced kind could not guarantee that.
//! `BrokerTemplate` is namespaced: its workloads run in its namespace.
//!
//! ## Instances
//! The v1 path keeps using the v0 [`Instance`](crate::v0::Instance) kind, unchanged, instead of
//! a second Instance version: no conversion webhook, and Akri brokers and tooling that read
//! Instances keep working. On the DRA path
//! - the kubelet-plugin writes Instances into the driver's own namespace, with
//!   `configurationName` naming the DiscoveryConfiguration and the label
//!   [`INSTANCE_SOURCE_LABEL`] = [`INSTANCE_SOURCE_DISCOVERY_CONFIGURATION`], so the two paths
//!   never mistake each other's Instances;
//! - `deviceUsage` stays empty: allocation state lives in ResourceClaims, owned by the
//!   scheduler, which is what removes Akri's slot leaks and races.

mod broker_template;
mod conditions;
mod discovery_configuration;
mod property_filter;
pub mod spec_mirror;

pub use crate::v0::Instance;
pub use broker_template::*;
pub use conditions::*;
pub use discovery_configuration::*;
pub use property_filter::*;

/// Label on Instances telling which kind `spec.configurationName` names.
pub const INSTANCE_SOURCE_LABEL: &str = "akri.sh/configuration-kind";
/// [`INSTANCE_SOURCE_LABEL`] value for Instances of the DRA path.
pub const INSTANCE_SOURCE_DISCOVERY_CONFIGURATION: &str = "DiscoveryConfiguration";
/// [`INSTANCE_SOURCE_LABEL`] value for Instances of the legacy device-plugin path, whose
/// `configurationName` names an `akri.sh/v0` Configuration in the Instance's namespace.
pub const INSTANCE_SOURCE_CONFIGURATION: &str = "Configuration";

/// Annotation on a DiscoveryConfiguration that `akri-migrate` made: `<namespace>/<name>` of
/// the v0 Configuration it was made of. It is the one link between the two: a node that
/// serves both holds the DiscoveryConfiguration back while that v0 Configuration (or its
/// Instances) is served, and a v0 Configuration that has a DiscoveryConfiguration's name
/// without this link is not served at all.
pub const MIGRATED_FROM_ANNOTATION: &str = "akri.sh/migrated-from";

/// The label selector of the Instances of one path (`source` is one of the two values above).
pub fn instance_source_selector(source: &str) -> String {
    format!("{INSTANCE_SOURCE_LABEL}={source}")
}

/// The label each node sets on the Instances that name it, value `"true"`:
/// `<node>.nodes.akri.sh/instance`. A node watches its Instances by it, so it hears nothing of
/// other nodes' devices. The node's name is in the key's prefix, not a digest of it, so that
/// the admission policy can tell a node's own label from another's (CEL has no hash);
/// `None` for a name too long for a prefix (over 239 characters): such a node watches its
/// path's Instances of the namespace.
pub fn instance_node_label(node: &str) -> Option<String> {
    let prefix = format!("{node}.nodes.akri.sh");
    (prefix.len() <= 253).then(|| format!("{prefix}/instance"))
}

/// Label on every Instance a node writes, value `"true"`: Instances without it were written
/// before nodes labelled their Instances ([`instance_node_label`]), and a node that starts
/// adopts those that name it, once.
pub const INSTANCE_NODES_LABELLED: &str = "akri.sh/nodes-labelled";
