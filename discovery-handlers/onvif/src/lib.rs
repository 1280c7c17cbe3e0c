//! The `onvif` discovery handler: IP cameras that answer a WS-Discovery probe for ONVIF
//! NetworkVideoTransmitters, reported as Akri's ONVIF handler reports them, so brokers written
//! for Akri keep working.
//!
//! Discovery details, as in Akri:
//!
//! ```yaml
//! ipAddresses: {action: Exclude, items: [10.0.0.9]}      # from GetNetworkInterfaces
//! macAddresses: {action: Include, items: ["00:11:22:33:44:01"]}
//! scopes: {action: Include, items: [onvif://www.onvif.org/location/dock]}
//! uuids: {action: Exclude, items: []}
//! discoveryTimeoutSeconds: 1                               # how long answers are awaited
//! cameras:                                                 # ours: cameras that ignore probes
//!   - deviceServiceUrl: http://10.0.0.21/onvif/device_service
//!     uuid: 5f1c0a2e-8f1e-4c55-9d0b-2f3a4b5c6d7e            # optional
//! ```
//!
//! Every rescan (10 s, as Akri's) sends one multicast probe ([`probe`]) and waits
//! `discoveryTimeoutSeconds` for answers. Each camera the uuid and scope filters admit is
//! asked (over its device service, [`device`]) for its network interfaces and, through the
//! media service, its first profile's stream URI, with the configuration's credential for it
//! ([`credentials`]: `username_<uuid>` / `password_<uuid>`, or `..._default`, from
//! `discoveryProperties`, usually a Secret). A camera is a device when the IP and MAC filters
//! admit it (an unknown address is admitted only by `Exclude` lists): id
//! `<service URL>-<uuid>`, properties `ONVIF_DEVICE_SERVICE_URL`, `ONVIF_DEVICE_UUID`,
//! `ONVIF_DEVICE_IP_ADDRESS` and `ONVIF_DEVICE_MAC_ADDRESS` (Akri's), and `ONVIF_STREAM_URI`
//! when the camera tells it (never with user info). Credentials are never logged or
//! reported, and go only to the address a camera's device service first answered at
//! ([`pins`]). Devices are shared: every node reaching a camera reports the same id.
//!
//! Many cameras ignore WS-Discovery (it is off, or they sit on another subnet than the
//! multicast reaches): `cameras` lists them by device-service URL (`http` or `https` at an IP
//! address, the address their credential goes to). A listed camera is asked every rescan, as
//! a found one, and is a device while its device service answers; the filters choose among
//! the cameras that answer probes and leave listed ones alone. Its uuid is the one given, or
//! else derived from its URL (a name-based UUID, version 5, in the URL namespace), so its
//! credential is `username_<uuid>` or the default one. A probe answer with a listed camera's
//! uuid is left out: the list says where that camera is.

pub mod credentials;
pub mod device;
pub mod pins;
pub mod probe;
mod xml;

use akri_discovery_handler::{DeviceLists, Discover, FilterList, proto};
use credentials::Credentials;
use device::{DeviceService, Info};
use probe::Camera;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// The name configurations use, as in Akri.
pub const NAME: &str = "onvif";
/// Cameras are reached over the network from any node.
pub const SHARED: bool = true;
pub const SERVICE_URL_PROPERTY: &str = "ONVIF_DEVICE_SERVICE_URL";
pub const UUID_PROPERTY: &str = "ONVIF_DEVICE_UUID";
pub const IP_ADDRESS_PROPERTY: &str = "ONVIF_DEVICE_IP_ADDRESS";
pub const MAC_ADDRESS_PROPERTY: &str = "ONVIF_DEVICE_MAC_ADDRESS";
pub const STREAM_URI_PROPERTY: &str = "ONVIF_STREAM_URI";

/// The handler: where probes go, how often, how long a device service may take.
#[derive(Clone, Debug)]
pub struct Onvif {
    pub probe_target: SocketAddr,
    pub rescan: Duration,
    pub query_timeout: Duration,
}

impl Default for Onvif {
    fn default() -> Self {
        Onvif {
            probe_target: probe::MULTICAST.parse().expect("a socket address"),
            rescan: Duration::from_secs(10),
            query_timeout: Duration::from_secs(5),
        }
    }
}

/// Akri's ONVIF discovery details.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Details {
    #[serde(default)]
    pub ip_addresses: Option<FilterList>,
    #[serde(default)]
    pub mac_addresses: Option<FilterList>,
    #[serde(default)]
    pub scopes: Option<FilterList>,
    #[serde(default)]
    pub uuids: Option<FilterList>,
    #[serde(default = "one_second")]
    pub discovery_timeout_seconds: u64,
    /// Cameras that do not answer probes, by device-service URL.
    #[serde(default)]
    pub cameras: Vec<ListedCamera>,
}

/// A camera the configuration lists (it does not answer WS-Discovery probes).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListedCamera {
    /// Its device service, e.g. `http://10.0.0.21/onvif/device_service`.
    pub device_service_url: String,
    /// Its endpoint uuid, when known (it names its credential); else one derived from the URL.
    #[serde(default)]
    pub uuid: Option<String>,
}

fn one_second() -> u64 {
    1
}

impl Details {
    fn check(&self) -> Result<(), String> {
        if !(1..=60).contains(&self.discovery_timeout_seconds) {
            return Err(format!(
                "discoveryTimeoutSeconds {}: between 1 and 60",
                self.discovery_timeout_seconds
            ));
        }
        self.listed().map(|_| ())
    }

    /// The listed cameras, in canonical form (the URL as parsed, the uuid lower case without
    /// `urn:uuid:`), or what is wrong with the list.
    fn listed(&self) -> Result<Vec<Camera>, String> {
        let mut cameras: Vec<Camera> = Vec::new();
        for listed in &self.cameras {
            let url = &listed.device_service_url;
            let parsed = url::Url::parse(url).map_err(|e| format!("cameras: {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || probe::host_of(url).is_none() {
                return Err(format!(
                    "cameras: {url:?}: an http or https URL at an IP address (the address the camera's credential goes to)"
                ));
            }
            let uuid = match &listed.uuid {
                Some(given) => uuid::Uuid::parse_str(&probe::uuid_of(given))
                    .map_err(|e| format!("cameras: uuid {given:?}: {e}"))?,
                None => uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, parsed.as_str().as_bytes()),
            }
            .to_string();
            if cameras.iter().any(|c| c.uuid == uuid) {
                return Err(format!("cameras: uuid {uuid} is listed twice"));
            }
            cameras.push(Camera {
                uuid,
                service_urls: vec![parsed.to_string()],
                scopes: Vec::new(),
            });
        }
        Ok(cameras)
    }

    fn admits_camera(&self, camera: &Camera) -> bool {
        FilterList::admits(self.uuids.as_ref(), &camera.uuid)
            && FilterList::admits_any(
                self.scopes.as_ref(),
                camera.scopes.iter().map(String::as_str),
            )
    }

    fn admits_info(&self, info: &Info) -> bool {
        let admits = |list: Option<&FilterList>, value: Option<&str>| match (list, value) {
            (None, _) => true,
            (Some(list), Some(value)) => {
                list.items.iter().any(|i| i.eq_ignore_ascii_case(value))
                    == (list.action == akri_discovery_handler::filter::FilterAction::Include)
            }
            // Unknown: only an Exclude list lets it through.
            (Some(list), None) => {
                list.action == akri_discovery_handler::filter::FilterAction::Exclude
            }
        };
        admits(self.ip_addresses.as_ref(), info.ip_address.as_deref())
            && admits(self.mac_addresses.as_ref(), info.mac_address.as_deref())
    }
}

impl Discover for Onvif {
    fn start(&self, request: proto::DiscoverRequest, lists: DeviceLists) -> Result<(), Status> {
        let details: Details =
            akri_discovery_handler::details::parse(NAME, &request.discovery_details)?;
        details
            .check()
            .map_err(|e| Status::invalid_argument(format!("onvif discovery details: {e}")))?;
        let credentials = Credentials::from_properties(
            request
                .discovery_properties
                .iter()
                .map(|(k, v)| (k.as_str(), v.vec.as_deref().unwrap_or_default())),
        );
        tokio::spawn(report(details, credentials, self.clone(), lists));
        Ok(())
    }
}

/// Probes now and every rescan interval until the agent goes away.
async fn report(details: Details, credentials: Credentials, onvif: Onvif, mut lists: DeviceLists) {
    let service = DeviceService::new(onvif.query_timeout);
    let credentials = Arc::new(credentials);
    let listed = details.listed().expect("checked at start");
    // What each camera's device service said, kept while the camera answers probes.
    let mut known: BTreeMap<String, Info> = BTreeMap::new();
    let mut pins = pins::Pins::default();
    let mut said = std::collections::BTreeSet::new();
    loop {
        let timeout = Duration::from_secs(details.discovery_timeout_seconds);
        let cameras = match probe::probe(onvif.probe_target, timeout).await {
            Ok(cameras) => cameras,
            Err(error) => {
                lists
                    .fail(Status::unavailable(format!("WS-Discovery probe: {error}")))
                    .await;
                return;
            }
        };
        let admitted: Vec<Camera> = cameras
            .into_iter()
            .filter(|c| details.admits_camera(c) && !listed.iter().any(|l| l.uuid == c.uuid))
            .collect();
        let (admitted, left_out) = pins.choose(admitted);
        for why in left_out.difference(&said) {
            tracing::warn!(%why, "ONVIF camera left out");
        }
        said = left_out;
        known.retain(|uuid, _| admitted.iter().any(|c| &c.uuid == uuid));
        let mut queries = tokio::task::JoinSet::new();
        for camera in admitted.iter().filter(|c| !known.contains_key(&c.uuid)) {
            let (service, credentials, camera) =
                (service.clone(), credentials.clone(), camera.clone());
            queries.spawn(async move {
                let url = service_url(&camera);
                let info = match service.info(&url, credentials.get(&camera.uuid)).await {
                    Ok(info) => Some(info),
                    Err(error) => {
                        tracing::warn!(%error, uuid = camera.uuid, "ONVIF device service");
                        None
                    }
                };
                (camera, info)
            });
        }
        // A listed camera answers no probe: its device service answering is its sign of life.
        let mut asked = tokio::task::JoinSet::new();
        for camera in &listed {
            let (service, credentials, camera) =
                (service.clone(), credentials.clone(), camera.clone());
            asked.spawn(async move {
                let url = service_url(&camera);
                match service.info(&url, credentials.get(&camera.uuid)).await {
                    Ok(info) => Some(device(&camera, &info)),
                    Err(error) => {
                        tracing::debug!(%error, %url, "listed ONVIF camera");
                        None
                    }
                }
            });
        }
        for (camera, info) in queries.join_all().await {
            // A camera that did not answer is asked again next time.
            if let Some(info) = info {
                pins.answered(&camera);
                known.insert(camera.uuid, info);
            }
        }
        let mut devices: Vec<proto::Device> = admitted
            .iter()
            .filter_map(|camera| {
                let info = known.get(&camera.uuid).cloned().unwrap_or_default();
                details.admits_info(&info).then(|| device(camera, &info))
            })
            .collect();
        devices.extend(asked.join_all().await.into_iter().flatten());
        if !lists.send(devices).await {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(onvif.rescan) => {}
            () = lists.closed() => return,
        }
    }
}

/// The camera's device-service URL: its first http one (IPv4 before IPv6).
fn service_url(camera: &Camera) -> String {
    camera
        .service_urls
        .iter()
        .find(|u| u.starts_with("http://") && !u.contains('['))
        .or(camera.service_urls.first())
        .cloned()
        .unwrap_or_default()
}

fn device(camera: &Camera, info: &Info) -> proto::Device {
    let url = service_url(camera);
    let mut properties = std::collections::HashMap::from([
        (SERVICE_URL_PROPERTY.to_string(), url.clone()),
        (UUID_PROPERTY.to_string(), camera.uuid.clone()),
    ]);
    for (name, value) in [
        (IP_ADDRESS_PROPERTY, &info.ip_address),
        (MAC_ADDRESS_PROPERTY, &info.mac_address),
        (STREAM_URI_PROPERTY, &info.stream_uri),
    ] {
        if let Some(value) = value {
            properties.insert(name.to_string(), value.clone());
        }
    }
    proto::Device {
        id: format!("{url}-{}", camera.uuid),
        properties,
        mounts: Vec::new(),
        device_specs: Vec::new(),
    }
}

/// The handler as its own process (the binary's whole life after its flags), served and
/// registered as `args` say until SIGTERM.
pub fn run_process(
    handler: Onvif,
    args: akri_discovery_handler::standalone::HandlerArgs,
) -> Result<(), akri_discovery_handler::standalone::Error> {
    akri_discovery_handler::standalone::run_process(|| handler, NAME, SHARED, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(text: &str) -> Result<Details, String> {
        let details: Details = akri_discovery_handler::details::parse(NAME, text)
            .map_err(|s| s.message().to_string())?;
        details.check()?;
        Ok(details)
    }

    #[test]
    fn akris_details_and_their_errors() {
        let d = details("ipAddresses: {action: Exclude, items: [10.0.0.9]}\nscopes: {items: [onvif://x/dock]}\ndiscoveryTimeoutSeconds: 2").unwrap();
        assert_eq!(d.discovery_timeout_seconds, 2);
        assert_eq!(details("").unwrap().discovery_timeout_seconds, 1);
        assert!(
            details("discoveryTimeoutSeconds: 0")
                .unwrap_err()
                .contains("between 1 and 60")
        );
        assert!(
            details("ipAdresses: {}")
                .unwrap_err()
                .contains("ipAdresses")
        );
        assert!(
            details("scopes: {action: Maybe}")
                .unwrap_err()
                .contains("Maybe")
        );
    }

    #[test]
    fn listed_cameras_in_canonical_form_and_their_errors() {
        let listed = details(
            "cameras:\n- deviceServiceUrl: HTTP://10.0.0.21/onvif/device_service\n  uuid: urn:uuid:5F1C0A2E-8F1E-4C55-9D0B-2F3A4B5C6D7E\n- deviceServiceUrl: http://10.0.0.22:8080/onvif/device_service",
        )
        .unwrap()
        .listed()
        .unwrap();
        assert_eq!(listed[0].uuid, "5f1c0a2e-8f1e-4c55-9d0b-2f3a4b5c6d7e");
        assert_eq!(
            listed[0].service_urls,
            ["http://10.0.0.21/onvif/device_service"]
        );
        // Without a uuid: a name-based one of the URL, the same on every node and every run.
        let derived = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_URL,
            b"http://10.0.0.22:8080/onvif/device_service",
        );
        assert_eq!(listed[1].uuid, derived.to_string());
        let error = |text: &str| details(text).unwrap_err();
        assert!(
            error("cameras:\n- deviceServiceUrl: http://camera.local/onvif/device_service")
                .contains("at an IP address")
        );
        assert!(
            error("cameras:\n- deviceServiceUrl: rtsp://10.0.0.21/stream")
                .contains("http or https")
        );
        assert!(
            error("cameras:\n- deviceServiceUrl: 10.0.0.21").contains("cameras: \"10.0.0.21\"")
        );
        assert!(
            error("cameras:\n- deviceServiceUrl: http://10.0.0.21/\n  uuid: not-a-uuid")
                .contains("uuid \"not-a-uuid\"")
        );
        assert!(
            error("cameras:\n- deviceServiceUrl: http://10.0.0.21/\n- deviceServiceUrl: http://10.0.0.21/")
                .contains("listed twice")
        );
        assert!(error("cameras:\n- url: http://10.0.0.21/").contains("url"));
    }

    #[test]
    fn filters_as_akri_applies_them() {
        let camera = Camera {
            uuid: "u1".into(),
            service_urls: vec!["http://10.0.0.11/onvif/device_service".into()],
            scopes: vec!["onvif://x/dock".into(), "onvif://x/name/cam1".into()],
        };
        let info = Info {
            ip_address: Some("10.0.0.11".into()),
            mac_address: Some("00:11:22:33:44:01".into()),
            stream_uri: None,
        };
        let d = |text: &str| details(text).unwrap();
        assert!(d("scopes: {items: [onvif://x/dock]}").admits_camera(&camera));
        assert!(!d("scopes: {action: Exclude, items: [onvif://x/dock]}").admits_camera(&camera));
        assert!(!d("uuids: {action: Exclude, items: [u1]}").admits_camera(&camera));
        assert!(d("ipAddresses: {items: [10.0.0.11]}").admits_info(&info));
        assert!(!d("ipAddresses: {action: Exclude, items: [10.0.0.11]}").admits_info(&info));
        assert!(d("macAddresses: {items: ['00:11:22:33:44:01']}").admits_info(&info));
        assert!(!d("macAddresses: {items: ['00:11:22:33:44:02']}").admits_info(&info));
        // Unknown addresses (no credential, say): only Exclude lists admit them.
        assert!(!d("ipAddresses: {items: [10.0.0.11]}").admits_info(&Info::default()));
        assert!(
            d("ipAddresses: {action: Exclude, items: [10.0.0.11]}").admits_info(&Info::default())
        );
        let device = device(&camera, &info);
        assert_eq!(device.id, "http://10.0.0.11/onvif/device_service-u1");
        assert_eq!(device.properties[IP_ADDRESS_PROPERTY], "10.0.0.11");
        assert!(!device.properties.contains_key(STREAM_URI_PROPERTY));
    }
}
