//! Admission policies a test puts in the API server's way, as a cluster's policy engine would:
//! the writes a component must survive being refused.

use crate::Error;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, PostParams};

/// What [`deny_unless`] refuses, and how.
pub struct Denial<'a> {
    /// The policy's and its binding's name.
    pub name: &'a str,
    /// `matchConstraints.resourceRules`' one rule: apiGroups, apiVersions, operations,
    /// resources.
    pub rule: serde_json::Value,
    /// CEL that must hold for the write to pass.
    pub expression: &'a str,
    /// The API server's message when it does not.
    pub message: &'a str,
    /// 403 Forbidden when true, else 422 Invalid (the API server's default).
    pub forbidden: bool,
    /// Bound to this namespace only; cluster-wide when `None`.
    pub namespace: Option<&'a str>,
}

/// A ValidatingAdmissionPolicy and its binding refusing what `denial` says. The API server
/// applies it a moment later: callers wait until a dry-run write is refused.
pub async fn deny_unless(client: &kube::Client, denial: Denial<'_>) -> Result<(), Error> {
    let mut validation = serde_json::json!({
        "expression": denial.expression, "message": denial.message,
    });
    if denial.forbidden {
        validation["reason"] = "Forbidden".into();
    }
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": { "name": denial.name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [denial.rule] },
            "validations": [validation],
        },
    }))
    .map_err(|e| Error::Other(format!("policy {}: {e}", denial.name)))?;
    let create = |what| move |e: kube::Error| Error::Other(format!("create {what}: {e}"));
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .map_err(create("the admission policy"))?;
    let mut spec = serde_json::json!({ "policyName": denial.name, "validationActions": ["Deny"] });
    if let Some(namespace) = denial.namespace {
        spec["matchResources"] = serde_json::json!({ "namespaceSelector": {
            "matchLabels": { "kubernetes.io/metadata.name": namespace } } });
    }
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(
        serde_json::json!({ "metadata": { "name": denial.name }, "spec": spec }),
    )
    .map_err(|e| Error::Other(format!("binding {}: {e}", denial.name)))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .map_err(create("the admission policy binding"))?;
    Ok(())
}
