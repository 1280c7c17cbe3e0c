//! Schema helpers shared by the v0 kinds (used through `#[schemars(schema_with = ...)]`).

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// An object whose content the apiserver keeps as it is, without validating it: what Akri's CRD
/// gives the embedded Pod, Job and Service specs, and it keeps the CRD small.
pub(crate) fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The schema of `T`, for a field of type `Option<T>`, without `nullable: true`.
///
/// The field stays optional. Because it is not nullable, the apiserver drops an explicit `null`
/// before it stores the object, which is what serde does with it too: the stored object then
/// reads and writes back unchanged.
pub(crate) fn not_nullable<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// A slot count that must be at least 1 (`Configuration.spec.capacity`).
pub(crate) fn positive_count(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "minimum": 1,
    })
}

/// A slot count that may be 0 (`Instance.spec.capacity`, as lenient as Akri's CRD).
pub(crate) fn count(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "integer",
        "minimum": 0,
    })
}
