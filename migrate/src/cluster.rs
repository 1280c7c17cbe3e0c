//! The live cluster: reading v0 Configurations and the workloads that may request their
//! devices, and applying the v1 objects with server-side apply under this tool's own field
//! manager (`--dry-run=server`: the API server validates everything and stores nothing).

use crate::convert::{MIGRATED_FROM, Migrated};
use crate::input::{self, Document, Input};
use crate::report::{Kind, Origin, Report};
use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

/// The `file` of documents read from the cluster.
pub const CLUSTER: &str = "cluster";

/// Workload kinds listed from the cluster. Pods and ReplicaSets that a controller owns are
/// left out: their owner is listed (and is what a user changes).
const WORKLOADS: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "Pod", "pods"),
    ("", "v1", "ReplicationController", "replicationcontrollers"),
    ("apps", "v1", "Deployment", "deployments"),
    ("apps", "v1", "ReplicaSet", "replicasets"),
    ("apps", "v1", "StatefulSet", "statefulsets"),
    ("apps", "v1", "DaemonSet", "daemonsets"),
    ("batch", "v1", "Job", "jobs"),
    ("batch", "v1", "CronJob", "cronjobs"),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listing {what}: {cause}")]
    List { what: String, cause: kube::Error },
}

fn api(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// Reads the v0 Configurations and the workloads of `namespace` (`None`: all namespaces).
pub async fn read(
    client: &kube::Client,
    namespace: Option<&str>,
    input: &mut Input,
    report: &mut Report,
) -> Result<(), Error> {
    let mut document = 0;
    let configurations = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("akri.sh", "v0", "Configuration"),
        "configurations",
    );
    let mut kinds = vec![(configurations, false)];
    for (group, version, kind, plural) in WORKLOADS {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        kinds.push((ApiResource::from_gvk_with_plural(&gvk, plural), true));
    }
    for (resource, workload) in kinds {
        let list = api(client, &resource, namespace)
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::List {
                what: format!("{} ({})", resource.plural, resource.api_version),
                cause: source,
            })?;
        let mut items = list.items;
        items.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        for mut item in items {
            let owned = item
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true));
            if workload && owned {
                continue;
            }
            item.metadata.managed_fields = None;
            let mut value = serde_json::to_value(&item).expect("an object serializes");
            value["apiVersion"] = resource.api_version.clone().into();
            value["kind"] = resource.kind.clone().into();
            if let Some(object) = value.as_object_mut() {
                object.remove("status");
            }
            let origin = Origin {
                file: CLUSTER.into(),
                document,
                item: None,
            };
            document += 1;
            input::sort(Document { origin, value }, input, report);
        }
    }
    Ok(())
}

/// How `--apply` writes.
#[derive(Clone, Debug)]
pub struct ApplyOptions {
    pub field_manager: String,
    pub dry_run: bool,
}

/// Applies every DiscoveryConfiguration, then every BrokerTemplate; a failure is an error in
/// `report` naming the object, and the others are still applied (running again after fixing
/// it completes the migration: applying the same object again changes nothing).
/// Returns a line per object applied, as kubectl says it
/// (`discoveryconfiguration.akri.sh/<name> serverside-applied`, `(server dry run)` after it
/// with `--dry-run=server`).
pub async fn apply(
    client: &kube::Client,
    migrated: &[Migrated],
    options: &ApplyOptions,
    report: &mut Report,
) -> Vec<String> {
    let mut applied = Vec::new();
    let said = |kind: &str, name: &str| match options.dry_run {
        true => format!("{kind}.akri.sh/{name} serverside-applied (server dry run)"),
        false => format!("{kind}.akri.sh/{name} serverside-applied"),
    };
    let params = PatchParams {
        field_manager: Some(options.field_manager.clone()),
        dry_run: options.dry_run,
        force: false,
        ..Default::default()
    };
    let configurations: Api<DiscoveryConfiguration> = Api::all(client.clone());
    for m in migrated {
        let object = format!("{}/{}", m.key.0, m.key.1);
        let name = m.name();
        match configurations.get_opt(name).await {
            Ok(Some(existing)) => {
                let from = existing
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(MIGRATED_FROM));
                if from != Some(&object) {
                    report.add(
                        &m.origin,
                        &object,
                        "metadata.name",
                        Kind::Error,
                        format!(
                            "DiscoveryConfiguration {name} exists and was not migrated from {object} ({MIGRATED_FROM}: {}): not overwritten; choose another name with --rename {object}=<name>",
                            from.map(String::as_str).unwrap_or("none")
                        ),
                    );
                    continue;
                }
            }
            Ok(None) => {}
            Err(e) => {
                report.add(
                    &m.origin,
                    &object,
                    "",
                    Kind::Error,
                    format!("reading DiscoveryConfiguration {name}: {e}"),
                );
                continue;
            }
        }
        if let Err(e) = configurations
            .patch(name, &params, &Patch::Apply(&m.discovery))
            .await
        {
            report.add(
                &m.origin,
                &object,
                "",
                Kind::Error,
                format!("applying DiscoveryConfiguration {name}: {e}"),
            );
            continue;
        }
        applied.push(said("discoveryconfiguration", name));
        if let Some(brokers) = &m.brokers {
            let api: Api<BrokerTemplate> = Api::namespaced(client.clone(), &m.key.0);
            match api.patch(&m.key.1, &params, &Patch::Apply(brokers)).await {
                Ok(_) => applied.push(said("brokertemplate", &m.key.1)),
                Err(e) => report.add(
                    &m.origin,
                    &object,
                    "",
                    Kind::Error,
                    format!("applying BrokerTemplate {object}: {e}"),
                ),
            }
        }
    }
    applied
}
