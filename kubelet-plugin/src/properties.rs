//! Resolving a DiscoveryConfiguration's discoveryProperties: literal values, and keys of
//! Secrets and ConfigMaps. Each referenced object is kept by a watch of that one object
//! (`metadata.name` field selector), so it is read when it changes and never per pass; an
//! edited Secret restarts the discovery with its new value as soon as the watch says so.

use akri_api::v1::{DiscoveryProperty, KeyReference};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::task::AbortOnDropHandle;

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
        cause: String,
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
    #[error(
        "discovery property {property}: Secret {namespace}/{name} is not one this node may read: name it in the chart's propertySecrets (--property-secrets), which lets the nodes read those Secrets by name and no other"
    )]
    SecretNotAllowed {
        property: String,
        namespace: String,
        name: String,
    },
    #[error(
        "discovery property {property}: {kind} {namespace}/{name} is outside the Configuration's namespace {own}; an akri.sh/v0 Configuration reads only its own namespace's Secrets and ConfigMaps (Akri's default namespace for a reference is `default`: set `namespace: {own}` and keep the object there)"
    )]
    OutsideOwnNamespace {
        property: String,
        kind: &'static str,
        namespace: String,
        name: String,
        own: String,
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

/// One referenced object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Source {
    kind: &'static str,
    namespace: String,
    name: String,
}

/// What the watch of one object last said.
#[derive(Clone, Debug, Default, PartialEq)]
struct Observed {
    /// The object's keys; `None`: it does not exist.
    data: Option<BTreeMap<String, Vec<u8>>>,
    /// The watch fails (outage, 403): `data` is what it last saw, possibly nothing yet.
    failing: Option<String>,
    /// The watch has answered at least once (listed, or failed).
    answered: bool,
}

struct Watched {
    observed: watch::Receiver<Observed>,
    _task: AbortOnDropHandle<()>,
}

/// The Secrets and ConfigMaps that discovery properties reference, each kept by its own
/// watch while some configuration names it.
pub struct PropertySources {
    client: kube::Client,
    allowed_namespaces: Option<BTreeSet<String>>,
    /// The Secrets (by name, in the allowed namespaces) the node may read; `None`: any.
    allowed_secrets: Option<BTreeSet<String>>,
    watched: BTreeMap<Source, Watched>,
    changed: Arc<Notify>,
}

/// How often an object the node may read but not watch is read again.
const POLL: Duration = Duration::from_secs(60);

/// How long the first answer about a newly referenced object may take before the property
/// counts as unreadable for now (the watch goes on; its answer causes a pass).
const FIRST_ANSWER: Duration = Duration::from_secs(10);

impl PropertySources {
    /// Sources read through `client`; with `allowed_namespaces`, references to other
    /// namespaces are refused without a request.
    pub fn new(client: kube::Client, allowed_namespaces: Option<BTreeSet<String>>) -> Self {
        PropertySources {
            client,
            allowed_namespaces,
            allowed_secrets: None,
            watched: BTreeMap::new(),
            changed: Arc::new(Notify::new()),
        }
    }

    /// Only these Secrets (by name) may be read: the chart grants the node a read of each by
    /// name and no list of a namespace, so a taken-over node reads no other Secret (Helm's
    /// release records live in the release namespace too). Others are refused without a
    /// request, saying which value names them.
    pub fn allowed_secrets(&mut self, names: Option<BTreeSet<String>>) {
        self.allowed_secrets = names;
    }

    /// Notified when a watched object changes (or its watch starts or stops failing).
    pub fn changes(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Stops watching objects that none of `properties` references.
    pub fn retain<'a>(&mut self, properties: impl IntoIterator<Item = &'a DiscoveryProperty>) {
        let used: BTreeSet<Source> = properties
            .into_iter()
            .filter_map(|p| reference(p).map(|(source, _)| source))
            .collect();
        self.watched.retain(|source, _| used.contains(source));
    }

    /// The properties as the handler receives them (name -> bytes). Optional references
    /// that do not resolve are left out. With `own_namespace` (a namespaced configuration's),
    /// references to any other namespace are refused too: whoever may create a Configuration
    /// in one namespace must not get another namespace's Secrets into a handler.
    pub async fn resolve(
        &mut self,
        properties: &[DiscoveryProperty],
        own_namespace: Option<&str>,
    ) -> Result<BTreeMap<String, Vec<u8>>, Error> {
        for property in properties {
            let Some((source, _)) = reference(property) else {
                continue;
            };
            if let Some(own) = own_namespace
                && source.namespace != own
            {
                return Err(Error::OutsideOwnNamespace {
                    property: property.name.clone(),
                    kind: source.kind,
                    namespace: source.namespace,
                    name: source.name,
                    own: own.to_string(),
                });
            }
            if let Some(allowed) = &self.allowed_namespaces
                && !allowed.contains(&source.namespace)
            {
                return Err(Error::NamespaceNotAllowed {
                    property: property.name.clone(),
                    kind: source.kind,
                    namespace: source.namespace,
                    name: source.name,
                });
            }
            if let Some(allowed) = &self.allowed_secrets
                && source.kind == "Secret"
                && !allowed.contains(&source.name)
            {
                return Err(Error::SecretNotAllowed {
                    property: property.name.clone(),
                    namespace: source.namespace,
                    name: source.name,
                });
            }
        }
        let mut resolved = BTreeMap::new();
        for property in properties {
            let value = if let Some(value) = &property.value {
                Some(value.clone().into_bytes())
            } else if let Some((source, key)) = reference(property) {
                let observed = self.observe(&source).await;
                let failed = |cause: String| Error::Read {
                    property: property.name.clone(),
                    kind: source.kind,
                    namespace: source.namespace.clone(),
                    name: source.name.clone(),
                    cause,
                };
                if let Some(cause) = observed.failing {
                    return Err(failed(cause));
                }
                if !observed.answered {
                    return Err(failed(format!("no answer within {FIRST_ANSWER:?}")));
                }
                let Some(data) = observed.data else {
                    if key.optional {
                        continue;
                    }
                    return Err(Error::Missing {
                        property: property.name.clone(),
                        kind: source.kind,
                        namespace: source.namespace,
                        name: source.name,
                    });
                };
                lookup(&property.name, &source, key, data.get(&key.key).cloned())?
            } else {
                return Err(Error::Empty(property.name.clone()));
            };
            if let Some(value) = value {
                resolved.insert(property.name.clone(), value);
            }
        }
        Ok(resolved)
    }

    /// What the watch of `source` says, starting it (and waiting for its first answer) if
    /// nothing watched it yet.
    async fn observe(&mut self, source: &Source) -> Observed {
        let watched = self.watched.entry(source.clone()).or_insert_with(|| {
            let (tx, observed) = watch::channel(Observed::default());
            let changed = self.changed.clone();
            let client = self.client.clone();
            let source = source.clone();
            let task = match source.kind {
                "Secret" => tokio::spawn(keep::<Secret>(client, source, secret_data, tx, changed)),
                _ => tokio::spawn(keep::<ConfigMap>(
                    client,
                    source,
                    config_map_data,
                    tx,
                    changed,
                )),
            };
            Watched {
                observed,
                _task: AbortOnDropHandle::new(task),
            }
        });
        let mut observed = watched.observed.clone();
        let _ = tokio::time::timeout(FIRST_ANSWER, observed.wait_for(|o| o.answered)).await;
        observed.borrow().clone()
    }
}

/// The object `property` takes its value from, and the key reference.
fn reference(property: &DiscoveryProperty) -> Option<(Source, &KeyReference)> {
    let from = property.value_from.as_ref()?;
    let (kind, reference) = match (&from.secret_key_ref, &from.config_map_key_ref) {
        (Some(reference), _) => ("Secret", reference),
        (None, Some(reference)) => ("ConfigMap", reference),
        (None, None) => return None,
    };
    let source = Source {
        kind,
        namespace: reference.namespace.clone(),
        name: reference.name.clone(),
    };
    Some((source, reference))
}

fn secret_data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    (secret.data.iter().flatten())
        .map(|(key, value)| (key.clone(), value.0.clone()))
        .collect()
}

fn config_map_data(config_map: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let binary = (config_map.binary_data.iter().flatten())
        .map(|(key, value)| (key.clone(), value.0.clone()));
    let text = (config_map.data.iter().flatten())
        .map(|(key, value)| (key.clone(), value.clone().into_bytes()));
    // A key in both: the text wins, as it did when a read looked in `data` first.
    binary.chain(text).collect()
}

/// Keeps `tx` up to date with the one object `source` names, and notifies `changed` when
/// what it says changes. Runs until dropped. A failing watch starts again from a fresh list
/// after a backoff (1 s doubling to 30 s): a watch that merely resumes says nothing, and the
/// list's answer is what ends the failure. Where the node may get but not list the object
/// (the chart's cluster-wide default), it reads it every [`POLL`] instead.
async fn keep<K>(
    client: kube::Client,
    source: Source,
    data_of: fn(&K) -> BTreeMap<String, Vec<u8>>,
    tx: watch::Sender<Observed>,
    changed: Arc<Notify>,
) where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api = Api::<K>::namespaced(client, &source.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", source.name));
    let tell = |next: Observed| {
        if tx.send_if_modified(|now| {
            let modified = *now != next;
            *now = next;
            modified
        }) {
            changed.notify_one();
        }
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        // Watch while the node may list (and so watch) the object.
        loop {
            let mut events = watcher(api.clone(), config.clone()).boxed();
            // Between Init and InitDone the list is under way: the object is what it lists.
            let mut listing = None;
            let mut may_list = true;
            while let Some(event) = events.next().await {
                let mut next = Observed {
                    answered: true,
                    failing: None,
                    ..tx.borrow().clone()
                };
                match event {
                    Ok(watcher::Event::Init) => {
                        listing = None;
                        continue;
                    }
                    Ok(watcher::Event::InitApply(object)) => {
                        listing = Some(data_of(&object));
                        continue;
                    }
                    Ok(watcher::Event::InitDone) => {
                        next.data = listing.take();
                        backoff = Duration::from_secs(1);
                    }
                    Ok(watcher::Event::Apply(object)) => next.data = Some(data_of(&object)),
                    Ok(watcher::Event::Delete(_)) => next.data = None,
                    Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                        if status.code == 403 =>
                    {
                        may_list = false;
                        break;
                    }
                    Err(error) => next.failing = Some(error.to_string()),
                }
                let failed = next.failing.is_some();
                tell(next);
                if failed {
                    break;
                }
            }
            if !may_list {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
        // May not list: read it every POLL while a GET is allowed, else try the list again.
        loop {
            let mut next = Observed {
                answered: true,
                ..tx.borrow().clone()
            };
            let result = crate::api_call(api.get_opt(&source.name)).await;
            next.failing = result.as_ref().err().map(ToString::to_string);
            let forbidden = matches!(&result, Err(kube::Error::Api(s)) if s.code == 403);
            if let Ok(object) = &result {
                next.data = object.as_ref().map(data_of);
            }
            tell(next);
            if forbidden {
                break;
            }
            tokio::time::sleep(if result.is_ok() { POLL } else { backoff }).await;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

fn lookup(
    property: &str,
    source: &Source,
    reference: &KeyReference,
    value: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, Error> {
    match value {
        Some(value) => Ok(Some(value)),
        None if reference.optional => Ok(None),
        None => Err(Error::MissingKey {
            property: property.to_string(),
            kind: source.kind,
            namespace: source.namespace.clone(),
            name: source.name.clone(),
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
        let mut sources = PropertySources::new(client, Some(allowed));
        let error = sources.resolve(&properties, None).await.unwrap_err();
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
            sources.resolve(literal_only, None).await.unwrap()["plain"],
            b"x"
        );
        assert!(
            sources.watched.is_empty(),
            "nothing watched for a refused reference"
        );
    }

    #[tokio::test]
    async fn secrets_not_named_for_the_node_are_refused_without_a_read() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let properties: Vec<DiscoveryProperty> = serde_json::from_value(serde_json::json!([
            { "name": "release", "valueFrom": { "secretKeyRef": {
                "name": "sh.helm.release.v1.akri.v1", "namespace": "akri", "key": "release" } } },
        ]))
        .unwrap();
        let mut sources = PropertySources::new(client, Some(BTreeSet::from(["akri".into()])));
        sources.allowed_secrets(Some(BTreeSet::from(["camera-credentials".to_string()])));
        let error = sources.resolve(&properties, None).await.unwrap_err();
        assert!(matches!(error, Error::SecretNotAllowed { .. }), "{error}");
        assert!(!error.is_transient());
        assert!(
            (error.to_string()).contains("Secret akri/sh.helm.release.v1.akri.v1")
                && error.to_string().contains("propertySecrets"),
            "{error}"
        );
        assert!(sources.watched.is_empty());
    }

    #[tokio::test]
    async fn a_namespaced_configuration_reads_only_its_own_namespace() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        // Akri's default namespace for a reference is `default`, whatever the Configuration's.
        let properties: Vec<DiscoveryProperty> = serde_json::from_value(serde_json::json!([
            { "name": "password", "valueFrom": { "secretKeyRef": {
                "name": "camera-creds", "namespace": "default", "key": "pw" } } },
        ]))
        .unwrap();
        // Even where the node may read that namespace.
        let allowed = BTreeSet::from(["default".to_string(), "team-a".to_string()]);
        let mut sources = PropertySources::new(client, Some(allowed));
        let error = (sources.resolve(&properties, Some("team-a")).await).unwrap_err();
        assert!(
            matches!(error, Error::OutsideOwnNamespace { .. }),
            "{error}"
        );
        assert!(!error.is_transient());
        let message = error.to_string();
        assert!(
            message.contains(
                "Secret default/camera-creds is outside the Configuration's namespace team-a"
            ),
            "{message}"
        );
        assert!(sources.watched.is_empty(), "nothing watched");
    }
}
