//! The value format of `Instance.spec.deviceUsage`.
//!
//! Every Instance has `capacity` usage slots; `deviceUsage` maps each slot id to a string that
//! says who holds the slot. Akri writes three forms, and this module is the only place in the
//! project that reads or writes them:
//!
//! | value | meaning | [`DeviceUsage`] |
//! |---|---|---|
//! | `""` | the slot is free | [`DeviceUsage::Free`] |
//! | `<node>` | an Instance-level device plugin on `<node>` holds the slot | [`DeviceUsage::Instance`] |
//! | `C:<vdev>:<node>` | the Configuration-level device plugin on `<node>` holds the slot for its virtual device id `<vdev>` | [`DeviceUsage::Configuration`] |
//!
//! # Parsing rules
//!
//! Parsing is strict, because the values are machine-written and a value that does not parse
//! means something else wrote the Instance (or a bug did); hiding that would leak slots.
//!
//! - Nothing is trimmed: a leading or trailing space makes the value invalid.
//! - `<node>` must be a valid Kubernetes node name: a DNS-1123 subdomain (lowercase letters,
//!   digits, `-` and `.`, at most 253 characters, every `.`-separated label starting and ending
//!   with a letter or digit). In particular a node name never contains `:`.
//! - A value is Configuration-level exactly when it starts with `C:` (upper-case `C`). What
//!   follows is split at the first `:` into `<vdev>` and `<node>`; both must be non-empty.
//!   A further `:` (for example `C:0:node-a:x`) is an error, not part of the node name.
//! - `<vdev>` is the virtual device id that the Configuration-level device plugin reported to the
//!   kubelet (Akri uses `"0"`, `"1"`, ...). It may use ASCII letters, digits, `-`, `_` and `.`.
//! - Any other value containing `:` (for example `c:0:node-a`) is rejected as an invalid node name.
//!
//! Formatting is the inverse: for every string `s` that parses, `s.parse::<DeviceUsage>()?
//! .to_string() == s`. Values built through [`DeviceUsage::instance`] and
//! [`DeviceUsage::configuration`] are validated the same way, so they format to strings that parse.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The prefix that marks a Configuration-level usage.
const CONFIGURATION_PREFIX: &str = "C:";

/// The longest node name Kubernetes accepts (a DNS-1123 subdomain).
const MAX_NODE_NAME_LEN: usize = 253;

/// Who holds one `deviceUsage` slot of an Instance.
///
/// Parse with [`str::parse`], format with [`ToString`]; see the [module docs](self) for the format.
/// It also (de)serializes as that string, so a `BTreeMap<String, DeviceUsage>` reads and writes a
/// whole `deviceUsage` map.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceUsage {
    /// The slot is free (`""`).
    #[default]
    Free,
    /// An Instance-level device plugin on `node` holds the slot (`<node>`).
    Instance {
        /// The node that holds the slot.
        node: String,
    },
    /// The Configuration-level device plugin on `node` holds the slot for its virtual device id
    /// `vdev` (`C:<vdev>:<node>`).
    Configuration {
        /// The virtual device id the Configuration-level device plugin reported to the kubelet.
        vdev: String,
        /// The node that holds the slot.
        node: String,
    },
}

/// Why a `deviceUsage` value (or the parts given to a [`DeviceUsage`] constructor) is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceUsageError {
    /// The value starts with `C:` but has no second `:`.
    #[error(
        "device usage {value:?} is malformed: a Configuration-level usage has the form \"C:<vdev>:<node>\""
    )]
    MissingNode {
        /// The whole value.
        value: String,
    },
    /// The `<vdev>` part of a `C:<vdev>:<node>` value is empty.
    #[error("device usage {value:?} has an empty virtual device id: expected \"C:<vdev>:<node>\"")]
    EmptyVirtualDevice {
        /// The whole value.
        value: String,
    },
    /// The `<vdev>` part of a `C:<vdev>:<node>` value contains a character that is not allowed.
    #[error(
        "device usage {value:?} has an invalid virtual device id {vdev:?}: only ASCII letters, digits, '-', '_' and '.' are allowed"
    )]
    InvalidVirtualDevice {
        /// The whole value.
        value: String,
        /// The offending virtual device id.
        vdev: String,
    },
    /// The `<node>` part of a `C:<vdev>:<node>` value is empty.
    #[error("device usage {value:?} has an empty node name: expected \"C:<vdev>:<node>\"")]
    EmptyNode {
        /// The whole value.
        value: String,
    },
    /// A `C:<vdev>:<node>` value has more than three `:`-separated fields.
    #[error(
        "device usage {value:?} has too many ':'-separated fields: expected \"C:<vdev>:<node>\""
    )]
    TooManyFields {
        /// The whole value.
        value: String,
    },
    /// The node name is not a valid Kubernetes node name.
    #[error("device usage {value:?} names an invalid node {node:?}: {reason}")]
    InvalidNode {
        /// The whole value.
        value: String,
        /// The offending node name.
        node: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl DeviceUsage {
    /// A slot held by the Instance-level device plugin on `node`; fails if `node` is not a valid
    /// node name.
    pub fn instance(node: impl Into<String>) -> Result<Self, DeviceUsageError> {
        let node = node.into();
        check_node(&node, &node)?;
        Ok(Self::Instance { node })
    }

    /// A slot held by the Configuration-level device plugin on `node` for virtual device id
    /// `vdev`; fails if either part is invalid.
    pub fn configuration(
        vdev: impl Into<String>,
        node: impl Into<String>,
    ) -> Result<Self, DeviceUsageError> {
        let (vdev, node) = (vdev.into(), node.into());
        let value = format!("{CONFIGURATION_PREFIX}{vdev}:{node}");
        check_vdev(&value, &vdev)?;
        check_node(&value, &node)?;
        Ok(Self::Configuration { vdev, node })
    }

    /// Whether the slot is free.
    pub fn is_free(&self) -> bool {
        matches!(self, Self::Free)
    }

    /// Whether an Instance-level device plugin holds the slot.
    pub fn is_instance_level(&self) -> bool {
        matches!(self, Self::Instance { .. })
    }

    /// Whether the Configuration-level device plugin holds the slot.
    pub fn is_configuration_level(&self) -> bool {
        matches!(self, Self::Configuration { .. })
    }

    /// The node that holds the slot, if it is not free.
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::Free => None,
            Self::Instance { node } | Self::Configuration { node, .. } => Some(node),
        }
    }

    /// The virtual device id, if the Configuration-level device plugin holds the slot.
    pub fn vdev(&self) -> Option<&str> {
        match self {
            Self::Configuration { vdev, .. } => Some(vdev),
            Self::Free | Self::Instance { .. } => None,
        }
    }

    /// Whether `node` holds the slot (at either level).
    pub fn is_held_by(&self, node: &str) -> bool {
        self.node() == Some(node)
    }
}

/// The JSON patch (RFC 6902) that changes slots only from the values their writer saw: a
/// `test` per slot, then a `replace` per slot (`changes`: slot, value now, value wanted). The
/// API server re-applies it, tests included, when a concurrent write got there first, so two
/// writers can never both take a slot; a failed test is a 422. The one place the slots'
/// writers (the legacy device plugins, the driver-controller) build their writes.
pub fn slot_patch<'a>(
    changes: impl IntoIterator<Item = (&'a str, &'a DeviceUsage, &'a DeviceUsage)>,
) -> serde_json::Value {
    let mut tests = Vec::new();
    let mut replaces = Vec::new();
    for (slot, from, to) in changes {
        // A JSON pointer segment (RFC 6901).
        let path = format!(
            "/spec/deviceUsage/{}",
            slot.replace('~', "~0").replace('/', "~1")
        );
        tests.push(serde_json::json!({"op": "test", "path": path, "value": from.to_string()}));
        replaces.push(serde_json::json!({"op": "replace", "path": path, "value": to.to_string()}));
    }
    tests.extend(replaces);
    serde_json::Value::Array(tests)
}

impl fmt::Display for DeviceUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Free => Ok(()),
            Self::Instance { node } => f.write_str(node),
            Self::Configuration { vdev, node } => write!(f, "{CONFIGURATION_PREFIX}{vdev}:{node}"),
        }
    }
}

impl FromStr for DeviceUsage {
    type Err = DeviceUsageError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.is_empty() {
            return Ok(Self::Free);
        }
        let Some(rest) = value.strip_prefix(CONFIGURATION_PREFIX) else {
            check_node(value, value)?;
            return Ok(Self::Instance {
                node: value.to_owned(),
            });
        };
        let Some((vdev, node)) = rest.split_once(':') else {
            return Err(DeviceUsageError::MissingNode {
                value: value.to_owned(),
            });
        };
        if node.contains(':') {
            return Err(DeviceUsageError::TooManyFields {
                value: value.to_owned(),
            });
        }
        check_vdev(value, vdev)?;
        check_node(value, node)?;
        Ok(Self::Configuration {
            vdev: vdev.to_owned(),
            node: node.to_owned(),
        })
    }
}

impl TryFrom<String> for DeviceUsage {
    type Error = DeviceUsageError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

impl From<DeviceUsage> for String {
    fn from(usage: DeviceUsage) -> Self {
        usage.to_string()
    }
}

/// Checks a Configuration-level virtual device id; `value` is the whole value, for the error.
fn check_vdev(value: &str, vdev: &str) -> Result<(), DeviceUsageError> {
    if vdev.is_empty() {
        return Err(DeviceUsageError::EmptyVirtualDevice {
            value: value.to_owned(),
        });
    }
    if !vdev
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(DeviceUsageError::InvalidVirtualDevice {
            value: value.to_owned(),
            vdev: vdev.to_owned(),
        });
    }
    Ok(())
}

/// Checks that `node` is a DNS-1123 subdomain, which is what Kubernetes requires of node names;
/// `value` is the whole value, for the error.
fn check_node(value: &str, node: &str) -> Result<(), DeviceUsageError> {
    let invalid = |reason| DeviceUsageError::InvalidNode {
        value: value.to_owned(),
        node: node.to_owned(),
        reason,
    };
    if node.is_empty() {
        return Err(DeviceUsageError::EmptyNode {
            value: value.to_owned(),
        });
    }
    if node.len() > MAX_NODE_NAME_LEN {
        return Err(invalid("a node name has at most 253 characters"));
    }
    for label in node.split('.') {
        if label.is_empty() {
            return Err(invalid(
                "a node name cannot start or end with '.' or contain \"..\"",
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "a node name may only contain lower-case letters, digits, '-' and '.'",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid(
                "every '.'-separated part of a node name must start and end with a letter or digit",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<DeviceUsage, DeviceUsageError> {
        value.parse()
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(parse("").unwrap(), DeviceUsage::Free);
        assert_eq!(
            parse("node-a").unwrap(),
            DeviceUsage::Instance {
                node: "node-a".into()
            }
        );
        assert_eq!(
            parse("C:0:node-b").unwrap(),
            DeviceUsage::Configuration {
                vdev: "0".into(),
                node: "node-b".into()
            }
        );
    }

    #[test]
    fn formats_back_to_the_same_string() {
        for value in [
            "",
            "node-a",
            "linux-dev3",
            "ip-10-0-0-1.ec2.internal",
            "a",
            "C:0:node-b",
            "C:17:node-b.example.com",
            "C:vdev-1_x.y:n",
        ] {
            assert_eq!(parse(value).unwrap().to_string(), value, "{value:?}");
        }
    }

    #[test]
    fn constructors_validate_and_round_trip() {
        let usage = DeviceUsage::configuration("3", "node-a").unwrap();
        assert_eq!(usage.to_string(), "C:3:node-a");
        assert_eq!(parse(&usage.to_string()).unwrap(), usage);
        assert_eq!(
            DeviceUsage::instance("node-a").unwrap().to_string(),
            "node-a"
        );
        assert!(matches!(
            DeviceUsage::instance(""),
            Err(DeviceUsageError::EmptyNode { .. })
        ));
        assert!(matches!(
            DeviceUsage::instance("Node-A"),
            Err(DeviceUsageError::InvalidNode { .. })
        ));
        assert!(matches!(
            DeviceUsage::configuration("", "node-a"),
            Err(DeviceUsageError::EmptyVirtualDevice { .. })
        ));
        assert!(matches!(
            DeviceUsage::configuration("0:1", "node-a"),
            Err(DeviceUsageError::InvalidVirtualDevice { .. })
        ));
        assert!(matches!(
            DeviceUsage::configuration("0", ""),
            Err(DeviceUsageError::EmptyNode { .. })
        ));
    }

    #[test]
    fn helpers() {
        let free = DeviceUsage::Free;
        assert!(free.is_free());
        assert_eq!(free.node(), None);
        assert_eq!(free.vdev(), None);
        assert!(!free.is_held_by("node-a"));

        let il = parse("node-a").unwrap();
        assert!(il.is_instance_level() && !il.is_free() && !il.is_configuration_level());
        assert_eq!(il.node(), Some("node-a"));
        assert_eq!(il.vdev(), None);
        assert!(il.is_held_by("node-a"));
        assert!(!il.is_held_by("node-b"));

        let cl = parse("C:4:node-b").unwrap();
        assert!(cl.is_configuration_level() && !cl.is_instance_level());
        assert_eq!(cl.node(), Some("node-b"));
        assert_eq!(cl.vdev(), Some("4"));
        assert!(cl.is_held_by("node-b"));

        assert_eq!(DeviceUsage::default(), DeviceUsage::Free);
    }

    #[test]
    fn rejects_malformed_configuration_usages() {
        assert_eq!(
            parse("C:"),
            Err(DeviceUsageError::MissingNode { value: "C:".into() })
        );
        assert_eq!(
            parse("C:0"),
            Err(DeviceUsageError::MissingNode {
                value: "C:0".into()
            })
        );
        assert_eq!(
            parse("C::node-a"),
            Err(DeviceUsageError::EmptyVirtualDevice {
                value: "C::node-a".into()
            })
        );
        assert_eq!(
            parse("C:0:"),
            Err(DeviceUsageError::EmptyNode {
                value: "C:0:".into()
            })
        );
        assert_eq!(
            parse("C::"),
            Err(DeviceUsageError::EmptyVirtualDevice {
                value: "C::".into()
            })
        );
        assert_eq!(
            parse("C:0:node-a:x"),
            Err(DeviceUsageError::TooManyFields {
                value: "C:0:node-a:x".into()
            })
        );
        assert_eq!(
            parse("C:0:node-a:"),
            Err(DeviceUsageError::TooManyFields {
                value: "C:0:node-a:".into()
            })
        );
        assert!(matches!(
            parse("C:0 :node-a"),
            Err(DeviceUsageError::InvalidVirtualDevice { .. })
        ));
        assert!(matches!(
            parse("C:v/1:node-a"),
            Err(DeviceUsageError::InvalidVirtualDevice { .. })
        ));
    }

    #[test]
    fn rejects_invalid_node_names() {
        for value in [
            " node-a",
            "node-a ",
            " ",
            "C:0: node-a",
            "C:0:node-a ",
            " C:0:node-a",
            "Node-A",
            "node_a",
            "node-a/0",
            "-node",
            "node-",
            "node..a",
            ".node",
            "node.",
            "node.-a",
            "c:0:node-a",
            "node-a:0",
            "C:0:Node-A",
            "nöde",
        ] {
            assert!(
                matches!(parse(value), Err(DeviceUsageError::InvalidNode { .. })),
                "{value:?} gave {:?}",
                parse(value)
            );
        }
        let longest = "a".repeat(MAX_NODE_NAME_LEN);
        assert!(parse(&longest).is_ok());
        assert!(matches!(
            parse(&format!("{longest}a")),
            Err(DeviceUsageError::InvalidNode { .. })
        ));
    }

    #[test]
    fn error_messages_name_the_value_and_the_expected_form() {
        let message = parse("C::node-a").unwrap_err().to_string();
        assert!(message.contains("\"C::node-a\""), "{message}");
        assert!(message.contains("C:<vdev>:<node>"), "{message}");

        let message = parse("Node-A").unwrap_err().to_string();
        assert!(message.contains("\"Node-A\""), "{message}");
        assert!(message.contains("lower-case"), "{message}");
    }

    #[test]
    fn serde_uses_the_string_form() {
        let usages: std::collections::BTreeMap<String, DeviceUsage> =
            serde_json::from_str(r#"{"s-0": "", "s-1": "node-a", "s-2": "C:0:node-b"}"#).unwrap();
        assert_eq!(usages["s-0"], DeviceUsage::Free);
        assert!(usages["s-1"].is_held_by("node-a"));
        assert_eq!(usages["s-2"].vdev(), Some("0"));
        assert_eq!(
            serde_json::to_value(&usages).unwrap(),
            serde_json::json!({"s-0": "", "s-1": "node-a", "s-2": "C:0:node-b"})
        );
        let err = serde_json::from_str::<DeviceUsage>(r#""C:""#).unwrap_err();
        assert!(err.to_string().contains("C:<vdev>:<node>"), "{err}");
    }
}
