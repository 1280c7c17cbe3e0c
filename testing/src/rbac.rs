//! The RBAC docs/operations.md documents for each component, to run it under that and nothing more.

use crate::{ControlPlane, Error};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};

/// The kubelet-plugin's cluster-wide rules (docs/operations.md, "RBAC"); Instances, Secret
/// and ConfigMap reads are granted per namespace, separately.
pub fn kubelet_plugin_rules() -> serde_json::Value {
    kubelet_plugin_rules_with(false)
}

/// [`kubelet_plugin_rules`], plus reading v0 Configurations (and removing the node's own
/// finalizer from them) when `legacy` (the chart's `legacyDevicePlugin.enabled`).
pub fn kubelet_plugin_rules_with(legacy: bool) -> serde_json::Value {
    let mut rules = serde_json::json!([
        { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get"] },
        { "apiGroups": ["akri.sh"], "resources": ["discoveryconfigurations/status"], "verbs": ["patch"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch", "create", "patch", "delete"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch"] },
        { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"], "verbs": ["associated-node:patch", "arbitrary-node:patch"] },
        { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"] },
    ]);
    if legacy {
        let at = rules.as_array().map_or(0, |r| {
            r.iter()
                .position(|r| r["resources"][0] == "discoveryconfigurations/status")
                .map_or(0, |i| i + 1)
        });
        rules.as_array_mut().expect("an array").insert(
            at,
            serde_json::json!({ "apiGroups": ["akri.sh"], "resources": ["configurations"], "verbs": ["get", "list", "watch", "patch"] }),
        );
    }
    rules
}

/// Grants `user` what the chart grants the kubelet-plugin where DRA is served: its
/// cluster-wide rules ([`kubelet_plugin_rules`]) through a ClusterRole and a
/// ClusterRoleBinding, and [`kubelet_plugin_namespace_rules`] and
/// [`kubelet_plugin_instance_rules`] in `namespace` (the Instances', where the
/// driver-controller writes what it hands the nodes) through a Role and a RoleBinding, all
/// named `binding`; [`revoke_kubelet_plugin`] takes them away.
pub async fn grant_kubelet_plugin(
    client: &kube::Client,
    user: &str,
    binding: &str,
    namespace: &str,
) -> Result<(), Error> {
    let subjects = serde_json::json!([{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }]);
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
        "subjects": subjects,
    }))
    .expect("static binding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &role_binding)
        .await?;
    let mut rules = kubelet_plugin_namespace_rules();
    (rules.as_array_mut().expect("an array")).extend(
        kubelet_plugin_instance_rules()
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": binding },
        "rules": rules,
    }))
    .expect("static role");
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    let role_binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": binding },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": binding },
        "subjects": subjects,
    }))
    .expect("static binding");
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role_binding)
        .await?;
    Ok(())
}

/// Takes away what [`grant_kubelet_plugin`] granted as `binding` (its bindings; the roles
/// stay, bound to no one).
pub async fn revoke_kubelet_plugin(
    client: &kube::Client,
    binding: &str,
    namespace: &str,
) -> Result<(), Error> {
    let params = kube::api::DeleteParams::default();
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(binding, &params)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .delete(binding, &params)
        .await?;
    Ok(())
}

/// The kubelet-plugin's rules on Instances, granted in the namespaces it writes them to only
/// (the chart's `<release>-kubelet-plugin-instances`, bound in the release namespace and the
/// legacy namespaces).
pub fn kubelet_plugin_instance_rules() -> serde_json::Value {
    serde_json::json!([
        { "apiGroups": ["akri.sh"], "resources": ["instances"], "verbs": ["get", "list", "watch", "create", "patch", "delete"] },
    ])
}

/// The kubelet-plugin's rules in the Instances' namespace where DRA is served (the chart's
/// `<release>-kubelet-plugin-from-driver-controller` Role): its binding-check ConfigMap,
/// watched by name, and the DiscoveryConfigurations' mirrors; its handler Lease.
pub fn kubelet_plugin_namespace_rules() -> serde_json::Value {
    serde_json::json!([
        { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"] },
        { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "patch"] },
    ])
}

/// Grants the ServiceAccount `kubelet-plugin` of `namespace` what the chart grants it where
/// DRA is served: [`kubelet_plugin_rules`] cluster-wide and [`kubelet_plugin_namespace_rules`]
/// in `namespace`; returns its user name. Call once per control plane and namespace.
pub async fn grant_kubelet_plugin_as_charted(
    cp: &ControlPlane,
    namespace: &str,
) -> Result<String, Error> {
    let admin = cp.client().await?;
    let user = format!("system:serviceaccount:{namespace}:kubelet-plugin");
    let name = format!("{namespace}-kubelet-plugin");
    grant_kubelet_plugin(&admin, &user, &name, namespace).await?;
    Ok(user)
}

/// A client of the ServiceAccount `kubelet-plugin` in `namespace` (impersonated), granted
/// what the chart grants it ([`grant_kubelet_plugin_as_charted`]).
pub async fn kubelet_plugin_client(
    cp: &ControlPlane,
    namespace: &str,
) -> Result<kube::Client, Error> {
    let user = grant_kubelet_plugin_as_charted(cp, namespace).await?;
    let mut config = cp.client_config().await?;
    config.auth_info.impersonate = Some(user);
    Ok(kube::Client::try_from(config)?)
}
