//! Binding conditions of shared devices (KEP-5007): the node the scheduler chose checks that
//! the device answers from there before the pod is bound to it.
//!
//! The driver-controller publishes shared devices with `bindsToNode` and the binding condition
//! [`BINDING_CONDITION`] (failure: [`BINDING_FAILURE_CONDITION`]). The scheduler allocates
//! one to a claim for the node it picked, writes that node into the allocation's node
//! selector, and waits before binding the pod. This module, in that node's kubelet-plugin,
//! sees the claim, checks the device and sets one of the two conditions on the claim's
//! `status.devices` entry; on the failure condition the scheduler deallocates and tries again.
//!
//! Why here: the check must run where the pod's traffic will come from, which only a
//! component on the chosen node can do, and must write the claim's status, which the
//! discovery handlers (no API credentials at all) cannot. The plugin's pod has the node's pod
//! network, the broker's.
//!
//! What is checked: that this node's handler reports the device now (a device that a grace
//! keeps listed for a node that no longer sees it fails here), and, for a device with a
//! network endpoint among its properties (ONVIF's device service URL, OPC UA's discovery URL),
//! that a TCP connection to it opens within the timeout. Written under the field manager
//! `<driver>/binding`, so prepare's own apply of the entry (under `<driver>`) keeps them.
//!
//! How the node hears of a claim: claims carry no label or field a node could select on, so
//! the driver-controller (which keeps every allocated claim in a store anyway) writes the
//! claims waiting for this node into this node's ConfigMap ([`akri_devices::binding`]); the
//! node watches that one object by name and reads each claim it names. So a node's cost is
//! its own waiting claims, never the cluster's claims, and it may not list claims at all.

use crate::node_devices::NodeDevices;
use akri_devices::binding::{checks_config_map, waiting_results};
use akri_devices::{BINDING_CONDITION, BINDING_FAILURE_CONDITION};
use dra_plugin::device_status::{self, DeviceStatus};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::runtime::watcher;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

/// The outcome of checking one device from this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub reachable: bool,
    /// A CamelCase reason: `Connected`, `Reported`, `NotReported`, `ConnectFailed`, `Timeout`.
    pub reason: &'static str,
    pub message: String,
}

/// (claim UID, driver, pool, device): one check.
type CheckKey = (String, String, String, String);

/// Checks the devices of claims allocated to this node that wait for [`BINDING_CONDITION`].
#[derive(Clone)]
pub struct BindingChecks {
    client: kube::Client,
    node: Arc<str>,
    /// Where the driver-controller routes this node's waiting claims (the Instances').
    namespace: Arc<str>,
    devices: NodeDevices,
    timeout: Duration,
    /// Checked or being checked: each once.
    seen: Arc<Mutex<BTreeSet<CheckKey>>>,
}

impl BindingChecks {
    /// The checks of node `node`, whose devices are `devices`, routed to it in `namespace`;
    /// a connection that has not opened after `timeout` fails the check.
    pub fn new(
        client: kube::Client,
        (node, namespace): (&str, &str),
        devices: NodeDevices,
        timeout: Duration,
    ) -> Self {
        BindingChecks {
            client,
            node: node.into(),
            namespace: namespace.into(),
            devices,
            timeout,
            seen: Arc::default(),
        }
    }

    /// Watches the claims and checks what waits, until dropped.
    pub fn spawn(self) -> AbortOnDropHandle<()> {
        AbortOnDropHandle::new(tokio::spawn(self.run()))
    }

    async fn run(self) {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.namespace);
        let name = checks_config_map(&self.node);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        // Not `default_backoff()`: it starts over at 0.8 s whenever the watcher begins a new
        // list, so a list refused (403) for good was retried about once a second (the outage
        // test's log flood). Here the wait doubles up to a minute until an event arrives.
        let mut stream = watcher(api, config).boxed();
        let mut backoff: Option<Duration> = None;
        while let Some(event) = stream.next().await {
            let routed = match event {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                    cm.data.unwrap_or_default()
                }
                Ok(watcher::Event::Delete(_)) => BTreeMap::new(),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                Err(error) => {
                    let wait = match backoff {
                        None => {
                            tracing::warn!(%error, "watching this node's binding checks failed; retrying");
                            Duration::from_secs(1)
                        }
                        Some(wait) => (wait * 2).min(Duration::from_secs(60)),
                    };
                    backoff = Some(wait);
                    tokio::time::sleep(wait).await;
                    continue;
                }
            };
            if backoff.take().is_some() {
                tracing::info!("watching this node's binding checks again");
            }
            self.routed(routed).await;
        }
    }

    /// Reads each claim routed to this node that no check has taken yet, and considers it;
    /// forgets the checks of claims no longer routed (a later allocation is checked again).
    async fn routed(&self, routed: BTreeMap<String, String>) {
        self.seen
            .lock()
            .expect("lock")
            .retain(|seen| routed.contains_key(&seen.0));
        for (uid, claim) in routed {
            let taken = self.seen.lock().expect("lock").iter().any(|s| s.0 == uid);
            let Some((namespace, name)) = claim.split_once('/') else {
                continue;
            };
            if taken {
                continue;
            }
            let api = Api::<ResourceClaim>::namespaced(self.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(claim)) if claim.metadata.uid.as_deref() == Some(uid.as_str()) => {
                    self.consider(&claim)
                }
                // Gone, or another claim of its name now: nothing waits.
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%namespace, claim = %name, %error, "reading a claim that waits for this node's binding check failed; retrying on the next routing")
                }
            }
        }
    }

    /// Starts a check for each of the claim's devices that waits for this node's word.
    fn consider(&self, claim: &ResourceClaim) {
        let (Some(uid), Some(namespace), Some(name)) = (
            claim.metadata.uid.clone(),
            claim.metadata.namespace.clone(),
            claim.metadata.name.clone(),
        ) else {
            return;
        };
        let waiting = waiting_here(claim, &self.node);
        if waiting.is_empty() {
            // Deallocated or gone: a later allocation (another pod, another try) is checked
            // again.
            self.seen.lock().expect("lock").retain(|seen| seen.0 != uid);
            return;
        }
        // One apply per driver with all its devices of the claim: the field manager
        // `<driver>/binding` owns what it last applied, so an apply naming one device would
        // take another's condition away.
        let mut by_driver: BTreeMap<String, Vec<DeviceRequestAllocationResult>> = BTreeMap::new();
        for result in waiting {
            let key = (
                uid.clone(),
                result.driver.clone(),
                result.pool.clone(),
                result.device.clone(),
            );
            if self.seen.lock().expect("lock").insert(key) {
                by_driver
                    .entry(result.driver.clone())
                    .or_default()
                    .push(result);
            }
        }
        for (driver, results) in by_driver {
            let this = self.clone();
            let (uid, namespace, name) = (uid.clone(), namespace.clone(), name.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for result in &results {
                    let outcome = this.check(&driver, &result.device).await;
                    tracing::info!(claim = %name, %namespace, device = %result.device, reachable = outcome.reachable, reason = outcome.reason, "binding check");
                    statuses.push(DeviceStatus {
                        pool: result.pool.clone(),
                        device: result.device.clone(),
                        share_id: result.share_id.clone(),
                        data: None,
                        conditions: vec![condition(&outcome)],
                    });
                }
                let claim = device_status::Claim {
                    namespace: &namespace,
                    name: &name,
                    uid: &uid,
                };
                let manager = format!("{driver}/binding");
                // Retried here: the claim may not change again while the scheduler waits.
                let mut applied = Ok(());
                for wait in [0, 1, 2, 4] {
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    let apply =
                        device_status::apply_as(&this.client, claim, &driver, &manager, &statuses);
                    applied = apply.await;
                    if applied.is_ok() {
                        break;
                    }
                }
                if let Err(error) = applied {
                    tracing::warn!(%error, "writing binding conditions failed; checking again on the claim's next change");
                    let mut seen = this.seen.lock().expect("lock");
                    for result in results {
                        seen.remove(&(uid.clone(), driver.clone(), result.pool, result.device));
                    }
                }
            });
        }
    }

    /// Whether `device` of `driver` answers from this node.
    pub async fn check(&self, driver: &str, device: &str) -> Outcome {
        let node = &self.node;
        let Some(known) = self.devices.lookup(driver, device) else {
            return Outcome {
                reachable: false,
                reason: "NotReported",
                message: format!(
                    "node {node}'s discovery handler does not report device {device} now"
                ),
            };
        };
        let Some((host, port)) = endpoint(driver, &known.device.properties) else {
            return Outcome {
                reachable: true,
                reason: "Reported",
                message: format!("node {node}'s discovery handler reports device {device}"),
            };
        };
        let address = format!("{host}:{port}");
        match tokio::time::timeout(
            self.timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Outcome {
                reachable: true,
                reason: "Connected",
                message: format!("node {node} connected to device {device} at {address}"),
            },
            Ok(Err(error)) => Outcome {
                reachable: false,
                reason: "ConnectFailed",
                message: format!(
                    "node {node} cannot connect to device {device} at {address}: {error}"
                ),
            },
            Err(_) => Outcome {
                reachable: false,
                reason: "Timeout",
                message: format!(
                    "device {device} at {address} did not answer node {node} within {}s",
                    self.timeout.as_secs_f32()
                ),
            },
        }
    }
}

/// The results of a claim that wait for this node's binding check: allocated to this node,
/// waiting ([`waiting_results`]).
fn waiting_here(claim: &ResourceClaim, node: &str) -> Vec<DeviceRequestAllocationResult> {
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Vec::new();
    };
    let here = allocation
        .node_selector
        .as_ref()
        .is_some_and(|selector| dra_plugin::claim::selects_node(selector, node));
    if !here {
        return Vec::new();
    }
    waiting_results(claim)
}

/// The condition an outcome sets: [`BINDING_CONDITION`] when reachable, else
/// [`BINDING_FAILURE_CONDITION`] (both True: a condition the scheduler reads is one it finds
/// True).
fn condition(outcome: &Outcome) -> Condition {
    Condition {
        type_: match outcome.reachable {
            true => BINDING_CONDITION,
            false => BINDING_FAILURE_CONDITION,
        }
        .to_string(),
        status: "True".to_string(),
        reason: outcome.reason.to_string(),
        message: outcome.message.clone(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: None,
    }
}

/// The network endpoint a device of `driver` is reached at, from its properties: ONVIF's
/// device service URL, OPC UA's discovery URL, a static device's `endpoint`. `None` for
/// handlers whose devices have none that we know (debugEcho, udev, yours) and static devices
/// listed without one: the check is then that the handler reports it.
pub fn endpoint(
    driver: &str,
    properties: &std::collections::BTreeMap<String, String>,
) -> Option<(String, u16)> {
    let handler = driver.strip_suffix(&format!(".{}", akri_devices::DRIVER_DOMAIN))?;
    let property = match handler {
        "onvif" => akri_onvif::SERVICE_URL_PROPERTY,
        "opcua" => akri_opcua::DISCOVERY_URL_PROPERTY,
        "static" => akri_static::ENDPOINT_PROPERTY,
        _ => return None,
    };
    host_and_port(properties.get(property)?)
}

/// A URL's host and port (the scheme's default port when none is given; `opc.tcp`'s is 4840).
fn host_and_port(url: &str) -> Option<(String, u16)> {
    let url = url::Url::parse(url).ok()?;
    let port = url
        .port_or_known_default()
        .or((url.scheme() == "opc.tcp").then_some(4840))?;
    let host = match url.host()? {
        url::Host::Domain(name) => name.to_string(),
        url::Host::Ipv4(address) => address.to_string(),
        url::Host::Ipv6(address) => address.to_string(),
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::DiscoveredDevice;
    use crate::node_devices::ConfigDevices;

    /// Checks of an ONVIF camera whose device service is at `url`, on real sockets: one that
    /// accepts, a closed port, one that never answers (its accept queue full), and a device
    /// the handler no longer reports.
    #[tokio::test]
    async fn a_check_connects_to_the_devices_endpoint_and_fails_by_refusal_or_timeout() {
        let devices = NodeDevices::new("node-a", true);
        let checks = |url: &str| {
            devices.set(
                "onvif.akri.sh",
                ConfigDevices {
                    configuration: "cams".into(),
                    capacity: 1,
                    unique_devices: true,
                    shared: true,
                    devices: vec![DiscoveredDevice {
                        id: "cam".into(),
                        properties: [(
                            akri_onvif::SERVICE_URL_PROPERTY.to_string(),
                            url.to_string(),
                        )]
                        .into(),
                        ..DiscoveredDevice::default()
                    }],
                },
            );
            let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            BindingChecks::new(
                client,
                ("node-a", "akri"),
                devices.clone(),
                Duration::from_secs(1),
            )
        };
        let device = || devices.known("onvif.akri.sh")[0].instance.clone();

        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/onvif/device_service", open.local_addr().unwrap());
        let outcome = checks(&url).check("onvif.akri.sh", &device()).await;
        assert_eq!(
            (outcome.reachable, outcome.reason),
            (true, "Connected"),
            "{outcome:?}"
        );

        let closed = open.local_addr().unwrap();
        drop(open);
        let outcome = checks(&format!("http://{closed}/"))
            .check("onvif.akri.sh", &device())
            .await;
        assert_eq!(
            (outcome.reachable, outcome.reason),
            (false, "ConnectFailed"),
            "{outcome:?}"
        );
        assert!(
            outcome.message.contains("node node-a cannot connect"),
            "{outcome:?}"
        );

        // A listener that never accepts, its queue filled: further SYNs go unanswered.
        let silent = tokio::net::TcpSocket::new_v4().unwrap();
        silent.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = silent.local_addr().unwrap();
        let _silent = silent.listen(0).unwrap();
        let mut queued = Vec::new();
        for _ in 0..4 {
            let connect = tokio::net::TcpStream::connect(address);
            if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), connect).await
            {
                queued.push(stream);
            }
        }
        let outcome = checks(&format!("http://{address}/"))
            .check("onvif.akri.sh", &device())
            .await;
        assert_eq!(
            (outcome.reachable, outcome.reason),
            (false, "Timeout"),
            "{outcome:?}"
        );

        let outcome = checks(&url).check("onvif.akri.sh", "cams-000000").await;
        assert_eq!(
            (outcome.reachable, outcome.reason),
            (false, "NotReported"),
            "{outcome:?}"
        );
    }

    #[test]
    fn endpoints_of_onvif_opcua_and_static_devices() {
        let props = |k: &str, v: &str| [(k.to_string(), v.to_string())].into();
        assert_eq!(
            endpoint(
                "onvif.akri.sh",
                &props(
                    "ONVIF_DEVICE_SERVICE_URL",
                    "http://10.0.0.7/onvif/device_service"
                )
            ),
            Some(("10.0.0.7".into(), 80))
        );
        assert_eq!(
            endpoint(
                "opcua.akri.sh",
                &props("OPCUA_DISCOVERY_URL", "opc.tcp://[fe80::1]:4841/")
            ),
            Some(("fe80::1".into(), 4841))
        );
        assert_eq!(
            endpoint(
                "opcua.akri.sh",
                &props("OPCUA_DISCOVERY_URL", "opc.tcp://user@plc-7:4842")
            ),
            Some(("plc-7".into(), 4842))
        );
        assert_eq!(
            endpoint(
                "static.akri.sh",
                &props("STATIC_DEVICE_ENDPOINT", "tcp://10.1.3.7:502")
            ),
            Some(("10.1.3.7".into(), 502))
        );
        assert_eq!(
            endpoint("static.akri.sh", &props("PLC_ADDRESS", "10.1.3.7:502")),
            None
        );
        assert_eq!(
            endpoint("debugecho.akri.sh", &props("DEBUG_ECHO_DESCRIPTION", "x")),
            None
        );
        assert_eq!(
            endpoint(
                "onvif.akri.sh",
                &props("ONVIF_DEVICE_SERVICE_URL", "garbage")
            ),
            None
        );
    }
}
