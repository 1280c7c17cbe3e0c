//! PropertyFilters: each compiles into a DeviceClass of its own that selects only the matching
//! devices of its DiscoveryConfiguration, with a status that says what it compiled to or why
//! it could not.

use super::{Context, Error};
use crate::device_class::{self, FILTER_LABEL};
use crate::property_filter;
use akri_api::v1::{
    CONDITION_READY, Instance, PropertyFilter, PropertyFilterStatus, set_condition,
};

use k8s_openapi::api::resource::v1::DeviceClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch};
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;

/// Filters whose DiscoveryConfiguration does not exist are never reached by a configuration's
/// reconciliation: look for them now and then.
pub(super) async fn orphan_filters(ctx: Arc<Context>) {
    ctx.stores_listed().await;
    let mut tick = tokio::time::interval(Duration::from_secs(3));
    loop {
        tick.tick().await;
        for filter in ctx.filters.state() {
            let reference = &filter.spec.discovery_reference.name;
            if ctx.configurations.get(&ObjectRef::new(reference)).is_none()
                && let Err(error) = ctx.reconcile_filter(&filter, None, &[]).await
            {
                tracing::warn!(filter = %filter.name_any(), %error, "updating the filter failed");
            }
        }
    }
}
impl Context {
    /// Compiles a filter into its DeviceClass and reports on it. `driver` is `None` when its
    /// DiscoveryConfiguration does not exist.
    pub(super) async fn reconcile_filter(
        &self,
        filter: &PropertyFilter,
        driver: Option<&str>,
        instances: &[Arc<Instance>],
    ) -> Result<(), Error> {
        let name = filter.name_any();
        let configuration = &filter.spec.discovery_reference.name;
        let generation = filter.metadata.generation;
        let before = filter.status.clone().unwrap_or_default();
        let mut status = PropertyFilterStatus {
            observed_generation: generation,
            conditions: before.conditions.clone(),
            ..PropertyFilterStatus::default()
        };
        let compiled = property_filter::compile(&filter.spec.filters);
        let outcome: Result<(String, &str), (&str, String)> = match (driver, compiled) {
            (None, _) => Err((
                "DiscoveryConfigurationNotFound",
                format!("DiscoveryConfiguration {configuration} does not exist"),
            )),
            (Some(_), _) if self.configurations.get(&ObjectRef::new(&name)).is_some() => Err((
                "NameConflict",
                format!(
                    "a DiscoveryConfiguration is also named {name} and owns the DeviceClass of that name; rename the filter"
                ),
            )),
            (Some(_), Err(error)) => Err(("InvalidFilter", error.to_string())),
            (Some(driver), Ok(expression)) => Ok((expression, driver)),
        };
        let outcome = match outcome {
            Ok((expression, driver)) => {
                let owner =
                    device_class::owner(filter).ok_or_else(|| Error::NoUid(name.clone()))?;
                let class =
                    device_class::for_filter(&name, configuration, driver, &expression, owner);
                match self.apply_class(&class).await {
                    Ok(None) => Ok(expression),
                    Ok(Some(why)) => Err(("DeviceClassConflict", why)),
                    // Refused as invalid (a limit we do not check ourselves): this filter's
                    // problem, not its configuration's.
                    Err(Error::Write {
                        cause: kube::Error::Api(status),
                        ..
                    }) if status.code == 422 => Err((
                        "InvalidFilter",
                        format!("the API server refused its DeviceClass: {}", status.message),
                    )),
                    Err(error) => return Err(error),
                }
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(expression) => {
                status.matching_devices = instances
                    .iter()
                    .filter(|i| {
                        property_filter::matches(&filter.spec.filters, &i.spec.broker_properties)
                    })
                    .count() as i32;
                status.compiled_expression = Some(expression);
                status.device_class_name = Some(name.clone());
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    true,
                    "Compiled",
                    format!(
                        "claims with deviceClassName {name} get only matching devices of {configuration}; {} match now",
                        status.matching_devices
                    ),
                    generation,
                );
            }
            Err((reason, message)) => {
                // A class compiled from an older, valid spec must not keep allocating.
                self.delete_filter_class(&name).await?;
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    false,
                    reason,
                    message,
                    generation,
                );
            }
        }
        if status == before {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": "akri.sh/v1",
            "kind": "PropertyFilter",
            "metadata": { "name": name },
            "status": status,
        });
        Api::<PropertyFilter>::all(self.client.clone())
            .patch_status(&name, &self.params(), &Patch::Apply(&patch))
            .await
            .map_err(|cause| Error::Write {
                kind: "PropertyFilter status",
                name,
                cause,
            })?;
        self.metrics.wrote("status", "apply", 1);
        Ok(())
    }

    async fn delete_filter_class(&self, filter: &str) -> Result<(), Error> {
        let api = Api::<DeviceClass>::all(self.client.clone());
        let Some(class) = api.get_opt(filter).await.ok().flatten() else {
            return Ok(());
        };
        let ours = class.labels().get(FILTER_LABEL).map(String::as_str) == Some(filter)
            && class.owner_references().iter().any(|r| {
                r.kind == <PropertyFilter as kube::Resource>::kind(&()) && r.name == filter
            });
        if !ours {
            return Ok(());
        }
        match api.delete(filter, &DeleteParams::default()).await {
            Ok(_) => {
                self.metrics.wrote("deviceclass", "delete", 1);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(cause) => Err(Error::Write {
                kind: "DeviceClass",
                name: filter.to_string(),
                cause,
            }),
        }
    }
}
