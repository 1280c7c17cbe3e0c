//! Resolving a DiscoveryConfiguration's discoveryProperties: literal values, and keys of
//! Secrets and ConfigMaps, read when discovery starts.

use akri_api::v1::{DiscoveryProperty, KeyReference};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use std::collections::BTreeMap;

/// A property that could not be resolved; the configuration's discovery does not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovery property {property}: {kind} {namespace}/{name} has no key {key}")]
    MissingKey {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error("discovery property {property}: reading {kind} {namespace}/{name}: {source}")]
    Read {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("discovery property {0} has neither value nor valueFrom")]
    Empty(String),
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
) -> Result<BTreeMap<String, Vec<u8>>, Error> {
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
    match Api::<K>::namespaced(client.clone(), &reference.namespace)
        .get_opt(&reference.name)
        .await
    {
        Ok(Some(object)) => Ok(Some(object)),
        Ok(None) if reference.optional => Ok(None),
        Ok(None) => Err(Error::MissingKey {
            property: property.to_string(),
            kind,
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            key: reference.key.clone(),
        }),
        Err(source) => Err(Error::Read {
            property: property.to_string(),
            kind,
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            source: Box::new(source),
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
