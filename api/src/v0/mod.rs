//! `akri.sh/v0`: Akri's `Configuration` and `Instance`, for the legacy device-plugin path and for
//! migration to v1.
//!
//! - [`configuration`]: [`Configuration`] (short name `akric`).
//! - [`instance`]: [`Instance`] (short name `akrii`).
//! - [`device_usage`]: [`DeviceUsage`], the one parser and formatter of `Instance.deviceUsage`
//!   values (`""`, `<node>`, `C:<vdev>:<node>`).
//!
//! # Compatibility contract
//!
//! These types are schema-compatible with Akri v0.13 (its `shared/src/akri` types and the CRDs of
//! its Helm chart), so that an existing Akri installation's objects, and the YAML its users
//! already have, work unchanged:
//!
//! 1. **Same JSON.** Field names, which fields are required, and the defaults are Akri's.
//!    Anything Akri's own serde accepts deserializes here; what its serde rejects (a missing
//!    `discoveryHandler.name`, an empty `brokerSpec`, a `valueFrom` with both or neither
//!    reference) is rejected here too.
//! 2. **Round trip.** Deserializing and serializing again gives back the same JSON, with one
//!    exception that Akri has as well: a field that Akri's serde defaults is written even when
//!    it was absent (`Configuration`: `capacity: 1`, `discoveryHandler.discoveryDetails: ""`,
//!    `brokerProperties: {}`, a key selector's `namespace: default`; `Instance`:
//!    `brokerProperties: {}`, `shared: false`, `nodes: []`, `deviceUsage: {}`). The CRDs
//!    generated from these types declare the same values as schema defaults, so the apiserver
//!    stores them too: **for every object read from the apiserver, read-then-write is the
//!    identity**: no field is added or lost.
//! 3. **Optional means absent, never `null`.** Optional fields are written only when set. Their
//!    schemas are not `nullable` (Akri's CRD marks some of them nullable), so the apiserver drops
//!    an explicit `null` instead of storing it; serde reads such a `null` as absent anyway.
//! 4. **Embedded Kubernetes specs** (`brokerPodSpec`, `brokerJobSpec`, `instanceServiceSpec`,
//!    `configurationServiceSpec`) are k8s-openapi types in Rust, and
//!    `type: object` + `x-kubernetes-preserve-unknown-fields: true` in the CRD, as in Akri's. The
//!    apiserver stores them as given, but, as with Akri, three things inside them do not survive
//!    a round trip through Rust: a field Kubernetes 1.36 does not know, an explicit `null`
//!    (Akri's own `test/yaml/akri-opcua-configuration.yaml` has `env: [{name: IDENTIFIER,
//!    value: null}]`, which comes back without `value`), and a quantity written as a number
//!    (`cpu: 1` comes back as `cpu: "1"`). All three mean the same to Kubernetes.
//! 5. **Validation** that the CRD adds to Akri's, each of which Akri's own code already relies
//!    on, so no object that Akri can use is rejected: `capacity >= 1`; `discoveryHandler.name`
//!    non-empty; a discovery property has exactly one of `value` and `valueFrom`, and a
//!    `valueFrom` exactly one of `secretKeyRef` and `configMapKeyRef` (CEL rules with messages;
//!    Akri's CRD says the same with `oneOf`); a key selector has a `key`; `brokerSpec` has
//!    exactly one of `brokerPodSpec` and `brokerJobSpec`. The discovery property name pattern
//!    (`^[_A-Za-z][_A-Za-z0-9]*$`) is Akri's.
//! 6. **Not carried over:** the `self == oldSelf` rule on `discoveryHandler` that Akri's Rust
//!    schema has but its installed CRD does not; adding it would make `helm upgrade` with new
//!    discovery details fail.
//!
//! Maps are `BTreeMap` rather than Akri's `HashMap` (same JSON, deterministic order), and the
//! Rust names of enum variants are shorter than Akri's ([`BrokerSpec::Pod`] for
//! `brokerPodSpec`); neither shows in the JSON.

pub mod configuration;
pub mod device_usage;
pub mod instance;
mod schema;

pub use configuration::{
    BrokerSpec, Configuration, ConfigurationSpec, DEFAULT_CAPACITY, DEFAULT_KEY_SELECTOR_NAMESPACE,
    DiscoveryHandlerInfo, DiscoveryProperty, DiscoveryPropertySource, KeySelector,
};
pub use device_usage::{DeviceUsage, DeviceUsageError, slot_patch};
pub use instance::{Instance, InstanceSpec};

/// The API version of every kind in this module.
pub const VERSION: &str = "v0";
