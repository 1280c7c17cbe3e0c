//! The RBAC docs/operations.md documents for each component, to run it under that and nothing more.

use crate::Error;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};

/// The kubelet-plugin's cluster-wide rules (docs/operations.md, "RBAC"); Secret and
/// ConfigMap reads are granted per namespace, separately.
pub fn kubelet_plugin_rules() -> serde_json::Value {
    kubelet_plugin_rules_with(false)
}

/// [`kubelet_plugin_rules`], plus reading v0 Configurations (and removing the node's own
/// finalizer from them) when `legacy` (the chart's `legacyDevicePlugin.enabled`).
pub fn kubelet_plugin_rules_with(legacy: bool) -> serde_json::Value {
    let mut rules = serde_json::json!([
        { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get"] },
        { "apiGroups": ["akri.sh"], "resources": ["discoveryconfigurations"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["akri.sh"], "resources": ["discoveryconfigurations/status"], "verbs": ["patch"] },
        { "apiGroups": ["akri.sh"], "resources": ["instances"], "verbs": ["get", "list", "watch", "create", "patch", "delete"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch", "create", "patch", "delete"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"], "verbs": ["associated-node:patch", "arbitrary-node:patch"] },
        { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"] },
    ]);
    if legacy {
        let at = rules.as_array().map_or(0, |r| {
            r.iter()
                .position(|r| r["resources"][0] == "instances")
                .map_or(0, |i| i + 1)
        });
        rules.as_array_mut().expect("an array").insert(
            at,
            serde_json::json!({ "apiGroups": ["akri.sh"], "resources": ["configurations"], "verbs": ["get", "list", "watch", "patch"] }),
        );
    }
    rules
}

/// Grants `user` the kubelet-plugin's cluster-wide rules through a ClusterRole and a
/// ClusterRoleBinding both named `binding`; delete the binding to take them away.
pub async fn grant_kubelet_plugin(
    client: &kube::Client,
    user: &str,
    binding: &str,
) -> Result<(), Error> {
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": { "name": binding },
        "rules": kubelet_plugin_rules(),
    }))
    .expect("static role");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let role_binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": binding },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": binding },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .expect("static binding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &role_binding)
        .await?;
    Ok(())
}
