//! Resolving a DiscoveryConfiguration's discoveryProperties: literal values, and keys of
//! Secrets and ConfigMaps, read (a GET each) on every pass of the node agent's loop, so that
//! an edited Secret restarts the discovery with its new value.

use akri_api::v1::{DiscoveryProperty, KeyReference};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use std::collections::{BTreeMap, BTreeSet};

/// A property that could not be resolved; the configuration's discovery does not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovery property {property}: {kind} {namespace}/{name} does not exist")]
    Missing {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("discovery property {property}: {kind} {namespace}/{name} has no key {key}")]
    MissingKey {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error("discovery property {property}: reading {kind} {namespace}/{name}: {cause}")]
    Read {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        cause: Box<kube::Error>,
    },
    #[error("discovery property {0} has neither value nor valueFrom")]
    Empty(String),
    #[error(
        "discovery property {property}: {kind} {namespace}/{name} is in a namespace this node may not read (--property-namespaces)"
    )]
    NamespaceNotAllowed {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
    },
}

impl Error {
    /// Whether the failure says nothing about the referenced object (the API server could not
    /// be asked, or refused us): the last values read stay good. Only a definite answer (the
    /// object or key does not exist) changes what discovery runs with.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Read { .. })
    }
}

/// The properties as the handler receives them (name -> bytes). Optional references that do
/// not resolve are left out.
pub async fn resolve(
    client: &kube::Client,
    properties: &[DiscoveryProperty],
    allowed_namespaces: Option<&BTreeSet<String>>,
) -> Result<BTreeMap<String, Vec<u8>>, Error> {
    for property in properties {
        let Some(source) = &property.value_from else {
            continue;
        };
        let references = [
            ("Secret", source.secret_key_ref.as_ref()),
            ("ConfigMap", source.config_map_key_ref.as_ref()),
        ];
        for (kind, reference) in references {
            if let (Some(reference), Some(allowed)) = (reference, allowed_namespaces)
                && !allowed.contains(&reference.namespace)
            {
                return Err(Error::NamespaceNotAllowed {
                    property: property.name.clone(),
                    kind,
                    namespace: reference.namespace.clone(),
                    name: reference.name.clone(),
                });
            }
        }
    }
    let mut resolved = BTreeMap::new();
    for property in properties {
        let value = if let Some(value) = &property.value {
            Some(value.clone().into_bytes())
        } else if let Some(source) = &property.value_from {
            if let Some(reference) = &source.secret_key_ref {
                let secret = read::<Secret>(client, &property.name, "Secret", reference).await?;
                let data = secret.and_then(|s| s.data).unwrap_or_default();
                lookup(
                    &property.name,
                    "Secret",
                    reference,
                    data.get(&reference.key).map(|b| b.0.clone()),
                )?
            } else if let Some(reference) = &source.config_map_key_ref {
                let config_map =
                    read::<ConfigMap>(client, &property.name, "ConfigMap", reference).await?;
                let value = config_map.and_then(|c| {
                    c.data
                        .and_then(|d| d.get(&reference.key).map(|v| v.clone().into_bytes()))
                        .or_else(|| {
                            c.binary_data
                                .and_then(|d| d.get(&reference.key).map(|b| b.0.clone()))
                        })
                });
                lookup(&property.name, "ConfigMap", reference, value)?
            } else {
                return Err(Error::Empty(property.name.clone()));
            }
        } else {
            return Err(Error::Empty(property.name.clone()));
        };
        if let Some(value) = value {
            resolved.insert(property.name.clone(), value);
        }
    }
    Ok(resolved)
}

async fn read<K>(
    client: &kube::Client,
    property: &str,
    kind: &'static str,
    reference: &KeyReference,
) -> Result<Option<K>, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), &reference.namespace);
    match crate::api_call(api.get_opt(&reference.name)).await {
        Ok(Some(object)) => Ok(Some(object)),
        Ok(None) if reference.optional => Ok(None),
        Ok(None) => Err(Error::Missing {
            property: property.to_string(),
            kind,
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
        }),
        Err(source) => Err(Error::Read {
            property: property.to_string(),
            kind,
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            cause: Box::new(source),
        }),
    }
}

fn lookup(
    property: &str,
    kind: &'static str,
    reference: &KeyReference,
    value: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, Error> {
    match value {
        Some(value) => Ok(Some(value)),
        None if reference.optional => Ok(None),
        None => Err(Error::MissingKey {
            property: property.to_string(),
            kind,
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            key: reference.key.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn references_outside_the_allowed_namespaces_are_refused_without_a_read() {
        // A client that cannot reach anything: the refusal must come before any request.
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let properties: Vec<DiscoveryProperty> = serde_json::from_value(serde_json::json!([
            { "name": "plain", "value": "x" },
            { "name": "password", "valueFrom": { "secretKeyRef": {
                "name": "camera-creds", "namespace": "kube-system", "key": "pw" } } },
        ]))
        .unwrap();
        let allowed = BTreeSet::from(["cameras".to_string()]);
        let error = resolve(&client, &properties, Some(&allowed))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::NamespaceNotAllowed { .. }));
        assert!(!error.is_transient(), "a definite refusal, not an outage");
        assert!(
            error
                .to_string()
                .contains("Secret kube-system/camera-creds"),
            "{error}"
        );
        let literal_only = &properties[..1];
        assert_eq!(
            resolve(&client, literal_only, Some(&allowed))
                .await
                .unwrap()["plain"],
            b"x"
        );
    }
}
