//! Every object a BrokerTemplate wants now: its per-Instance objects for each Instance (per
//! node that reaches it when the name says so), the Instance's ResourceClaimTemplate when one
//! of them runs pods, and its global objects while at least one Instance exists.

use crate::render::{self, Owner, Rendered, Values};
use akri_api::v1::{BrokerTemplateSpec, Instance};
use kube::ResourceExt;
use std::collections::BTreeSet;
use std::sync::Arc;

/// What the template wants, and what could not be rendered.
#[derive(Debug, Default)]
pub struct Desired {
    pub objects: Vec<Rendered>,
    /// One line per object that could not be rendered.
    pub errors: Vec<String>,
    /// Instances missing an object (rendering failed): their objects are kept as they are.
    pub failed_instances: BTreeSet<String>,
    /// A global object could not be rendered: the global objects are kept as they are.
    pub failed_globals: bool,
    /// Objects wait for something to appear (the configuration's DeviceClass).
    pub waiting: bool,
}

pub fn desired(
    spec: &BrokerTemplateSpec,
    configuration: &str,
    device_class: Option<&str>,
    instances: &[Arc<Instance>],
    owner: &Owner,
) -> Desired {
    let mut out = Desired::default();
    let base = Values {
        template: owner.name,
        configuration,
        device_class,
        ..Default::default()
    };
    let needs_claim = spec
        .instance_broker_resources
        .iter()
        .any(|r| render::runs_pods(r.0.get("kind").and_then(|k| k.as_str()).unwrap_or_default()));
    for instance in instances {
        let name = instance.name_any();
        let claim_template = render::claim_template_name(&name, owner.name);
        if needs_claim {
            match device_class {
                Some(class) => {
                    out.objects
                        .push(render::claim_template(&claim_template, &name, class, owner))
                }
                None => {
                    out.waiting = true;
                    out.failed_instances.insert(name.clone());
                    out.errors.push(format!(
                        "Instance {name}: waiting for DiscoveryConfiguration {configuration} to have a DeviceClass"
                    ));
                    continue;
                }
            }
        }
        let values = Values {
            instance: Some(&name),
            claim_template: needs_claim.then_some(claim_template.as_str()),
            properties: Some(&instance.spec.broker_properties),
            ..base.clone()
        };
        for (index, resource) in spec.instance_broker_resources.iter().enumerate() {
            let nodes: Vec<Option<&str>> = match render::per_node(&resource.0) {
                Ok(true) => {
                    let mut nodes: Vec<&str> =
                        instance.spec.nodes.iter().map(String::as_str).collect();
                    nodes.sort();
                    nodes
                        .into_iter()
                        .take(instance.spec.capacity.max(1))
                        .map(Some)
                        .collect()
                }
                Ok(false) => vec![None],
                Err(error) => {
                    out.failed_instances.insert(name.clone());
                    out.errors
                        .push(format!("instanceBrokerResources[{index}]: {error}"));
                    continue;
                }
            };
            for node in nodes {
                let values = Values {
                    node,
                    ..values.clone()
                };
                match render::render(&resource.0, true, &values, owner) {
                    Ok(rendered) => out.objects.push(rendered),
                    Err(error) => {
                        out.failed_instances.insert(name.clone());
                        out.errors.push(format!(
                            "instanceBrokerResources[{index}] for Instance {name}: {error}"
                        ));
                    }
                }
            }
        }
    }
    if !instances.is_empty() {
        for (index, resource) in spec.global_broker_resources.iter().enumerate() {
            match render::render(&resource.0, false, &base, owner) {
                Ok(rendered) => out.objects.push(rendered),
                Err(error) => {
                    out.failed_globals = true;
                    out.errors
                        .push(format!("globalBrokerResources[{index}]: {error}"));
                }
            }
        }
    }
    // Two objects of one kind and name would overwrite each other: the later ones are refused.
    let mut seen = BTreeSet::new();
    out.objects.retain(|o| {
        let fresh = seen.insert((o.api_version.clone(), o.kind.clone(), o.name.clone()));
        if !fresh {
            out.errors.push(format!(
                "{} is rendered twice; give the objects distinct names",
                o.describe()
            ));
            if let Some(instance) = &o.instance {
                out.failed_instances.insert(instance.clone());
            }
        }
        fresh
    });
    out
}
