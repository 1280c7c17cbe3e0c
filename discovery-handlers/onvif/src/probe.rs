//! WS-Discovery: one multicast Probe for ONVIF NetworkVideoTransmitters, and the
//! ProbeMatches that come back within the timeout.
//!
//! Whoever answers a probe is untrusted: it is on the network, and the handler runs on the
//! host's network. A camera's device service is taken only at the address its answer came
//! from (the handler sends the camera's credential there, and nowhere an answer merely
//! names), and one probe window keeps at most [`MAX_CAMERAS`] cameras from at most
//! [`MAX_ANSWERS`] datagrams, however many arrive; of those, one address gets at most
//! [`MAX_PER_SOURCE`] datagrams read and cameras kept, so that one peer flooding the window
//! with junk or fresh uuids cannot keep the other cameras out. The same uuid answering from
//! two addresses is kept once per address: which one is the camera is the caller's to say
//! (`lib.rs` pins a camera to the address its credential was first accepted at).

use crate::xml;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::UdpSocket;

/// WS-Discovery's IPv4 multicast group and port.
pub const MULTICAST: &str = "239.255.255.250:3702";

/// The most cameras one probe window keeps; later new ones are left out (and logged).
pub const MAX_CAMERAS: usize = 1024;

/// The most datagrams one probe window reads; the window ends after them.
pub const MAX_ANSWERS: usize = 4 * MAX_CAMERAS;

/// The most datagrams read, and cameras kept, from one address in one window: a camera
/// answers a probe once, an NVR for a few cameras; the rest of a flood is dropped unread.
pub const MAX_PER_SOURCE: usize = 16;

/// A camera that answered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Camera {
    /// Its endpoint's uuid, lower case, without `urn:uuid:` (Akri's form).
    pub uuid: String,
    /// Its device-service URLs (`XAddrs`).
    pub service_urls: Vec<String>,
    pub scopes: Vec<String>,
}

/// The probe, with a fresh MessageID.
fn message(id: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:dn="http://www.onvif.org/ver10/network/wsdl"><s:Header><a:MessageID>uuid:{id}</a:MessageID><a:To>urn:schemas-xmlsoap-org:ws:2005:04:discovery</a:To><a:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/Probe</a:Action></s:Header><s:Body><d:Probe><d:Types>dn:NetworkVideoTransmitter</d:Types></d:Probe></s:Body></s:Envelope>"#
    )
}

/// The cameras in one ProbeMatches message (only answers to our probe count).
pub fn parse(response: &str, probe_id: &str) -> Vec<Camera> {
    let relates = xml::texts(response, &["Header", "RelatesTo"]);
    if !relates
        .iter()
        .any(|r| r.trim_start_matches("urn:").trim_start_matches("uuid:") == probe_id)
    {
        return Vec::new();
    }
    let matches = xml::texts(response, &["ProbeMatch", "EndpointReference", "Address"]);
    let addrs = xml::texts(response, &["ProbeMatch", "XAddrs"]);
    let scopes = xml::texts(response, &["ProbeMatch", "Scopes"]);
    matches
        .iter()
        .enumerate()
        .map(|(i, address)| Camera {
            uuid: uuid_of(address),
            service_urls: words(addrs.get(i)),
            scopes: words(scopes.get(i)),
        })
        .filter(|c| !c.uuid.is_empty() && !c.service_urls.is_empty())
        .collect()
}

/// `camera` with only the device-service URLs at `from`, the address its answer came from;
/// `None` when it names none there.
pub fn at_sender(mut camera: Camera, from: IpAddr) -> Option<Camera> {
    camera.service_urls.retain(|u| host_of(u) == Some(from));
    (!camera.service_urls.is_empty()).then_some(camera)
}

/// The IP address a URL names as its host (`None` for a name or no host).
pub fn host_of(url: &str) -> Option<IpAddr> {
    match url::Url::parse(url).ok()?.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

fn words(text: Option<&String>) -> Vec<String> {
    text.map(|t| t.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `urn:uuid:ABC` -> `abc`, as Akri normalizes it.
pub fn uuid_of(address: &str) -> String {
    let s = address.strip_prefix("urn:").unwrap_or(address);
    s.strip_prefix("uuid:").unwrap_or(s).to_lowercase()
}

/// Sends one probe to `target` and collects answers until `timeout`, one entry per camera
/// and answering address.
pub async fn probe(target: SocketAddr, timeout: Duration) -> std::io::Result<Vec<Camera>> {
    let socket = UdpSocket::bind("0.0.0.0:0").await?;
    socket.set_multicast_ttl_v4(2)?;
    let id = uuid::Uuid::new_v4().to_string();
    socket.send_to(message(&id).as_bytes(), target).await?;
    let mut cameras: BTreeMap<(String, IpAddr), Camera> = BTreeMap::new();
    // Per address: datagrams read, cameras kept.
    let mut sources: BTreeMap<IpAddr, (usize, usize)> = BTreeMap::new();
    let (mut elsewhere, mut over, mut flooding) = (0, 0, 0);
    let mut read = 0;
    let mut buffer = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    while read < MAX_ANSWERS {
        let Ok(received) = tokio::time::timeout_at(deadline, socket.recv_from(&mut buffer)).await
        else {
            break;
        };
        let (length, from) = received?;
        let source = sources.entry(from.ip()).or_default();
        if source.0 >= MAX_PER_SOURCE {
            // Dropped unread, and not counted against the window: one address cannot end it.
            flooding += 1;
            continue;
        }
        source.0 += 1;
        read += 1;
        let text = String::from_utf8_lossy(&buffer[..length]);
        for camera in parse(&text, &id) {
            let Some(camera) = at_sender(camera, from.ip()) else {
                elsewhere += 1;
                continue;
            };
            let key = (camera.uuid.clone(), from.ip());
            if cameras.contains_key(&key) {
                continue;
            }
            if cameras.len() >= MAX_CAMERAS || source.1 >= MAX_PER_SOURCE {
                over += 1;
                continue;
            }
            source.1 += 1;
            cameras.insert(key, camera);
        }
    }
    if elsewhere > 0 {
        tracing::warn!(
            answers = elsewhere,
            "cameras whose device service is not at the address they answered from were left out (their credentials go only there)"
        );
    }
    if over > 0 {
        tracing::warn!(
            left_out = over,
            "more than {MAX_CAMERAS} cameras answered one probe, or more than {MAX_PER_SOURCE} from one address"
        );
    }
    if flooding > 0 {
        let flooding_sources: Vec<String> = (sources.iter())
            .filter(|(_, (datagrams, _))| *datagrams >= MAX_PER_SOURCE)
            .map(|(ip, _)| ip.to_string())
            .collect();
        tracing::warn!(
            dropped = flooding,
            sources = flooding_sources.join(", "),
            "more than {MAX_PER_SOURCE} answers from one address in one probe window: the rest dropped unread"
        );
    }
    Ok(cameras.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATCHES: &str = r#"<?xml version="1.0" ?><s:Envelope xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Header><a:Action>http://schemas.xmlsoap.org/ws/2005/04/discovery/ProbeMatches</a:Action><a:RelatesTo>uuid:PROBE</a:RelatesTo></s:Header><s:Body><d:ProbeMatches><d:ProbeMatch><a:EndpointReference><a:Address>urn:uuid:1B4E28BA-2FA1-11D2-883F-0016D3CCA427</a:Address></a:EndpointReference><d:Types>dn:NetworkVideoTransmitter</d:Types><d:Scopes>onvif://www.onvif.org/name/cam1 onvif://www.onvif.org/location/dock</d:Scopes><d:XAddrs>http://10.0.0.11/onvif/device_service http://[fe80::1]/onvif/device_service</d:XAddrs><d:MetadataVersion>1</d:MetadataVersion></d:ProbeMatch></d:ProbeMatches></s:Body></s:Envelope>"#;

    #[test]
    fn probe_matches_give_uuid_service_urls_and_scopes() {
        let cameras = parse(MATCHES, "PROBE");
        assert_eq!(
            cameras,
            [Camera {
                uuid: "1b4e28ba-2fa1-11d2-883f-0016d3cca427".into(),
                service_urls: vec![
                    "http://10.0.0.11/onvif/device_service".into(),
                    "http://[fe80::1]/onvif/device_service".into()
                ],
                scopes: vec![
                    "onvif://www.onvif.org/name/cam1".into(),
                    "onvif://www.onvif.org/location/dock".into()
                ],
            }]
        );
        assert!(
            parse(MATCHES, "another-probe").is_empty(),
            "not an answer to ours"
        );
        assert!(parse("garbage", "PROBE").is_empty());
    }

    #[test]
    fn only_device_services_at_the_answering_address_are_kept() {
        let camera = parse(MATCHES, "PROBE").remove(0);
        let kept = at_sender(camera.clone(), "10.0.0.11".parse().unwrap()).unwrap();
        assert_eq!(kept.service_urls, ["http://10.0.0.11/onvif/device_service"]);
        let v6 = at_sender(camera.clone(), "fe80::1".parse().unwrap()).unwrap();
        assert_eq!(v6.service_urls, ["http://[fe80::1]/onvif/device_service"]);
        // An answer from elsewhere naming these addresses: nothing is taken from it.
        assert!(at_sender(camera, "10.0.0.66".parse().unwrap()).is_none());
        assert_eq!(host_of("http://camera.local/onvif"), None);
    }

    /// Answers each probe it receives with `cameras` ProbeMatches, one camera each, whose
    /// device service is at `service_host`.
    async fn responder(cameras: usize, service_host: &'static str) -> SocketAddr {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let address = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 64 * 1024];
            let (length, from) = socket.recv_from(&mut buffer).await.unwrap();
            let probe = String::from_utf8_lossy(&buffer[..length]).into_owned();
            let id = xml::texts(&probe, &["Header", "MessageID"]).remove(0);
            for i in 0..cameras {
                let answer = MATCHES
                    .replace("uuid:PROBE", &id)
                    .replace(
                        "1B4E28BA-2FA1-11D2-883F-0016D3CCA427",
                        &format!("{i:08}-0000-4000-8000-000000000000"),
                    )
                    .replace("10.0.0.11", service_host);
                socket.send_to(answer.as_bytes(), from).await.unwrap();
                // Paced, so that the receiving socket's buffer drops none.
                if i % 16 == 15 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
        address
    }

    #[tokio::test]
    async fn a_probe_keeps_cameras_at_their_answering_address_and_at_most_its_bound() {
        let found = probe(responder(3, "127.0.0.1").await, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(found.len(), 3);
        assert!(
            found
                .iter()
                .all(|c| c.service_urls == ["http://127.0.0.1/onvif/device_service"])
        );
        // Answers naming another host than the one answering: no camera.
        let found = probe(responder(3, "10.0.0.11").await, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(found.is_empty(), "{found:?}");
        // A flood from one address: that address keeps its bound.
        let flood = MAX_CAMERAS + 200;
        let found = probe(responder(flood, "127.0.0.1").await, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(found.len(), MAX_PER_SOURCE);
    }

    /// One peer on the LAN answering with junk and 1,200 fresh uuids, then a camera at
    /// another address: before the per-address bound the flood filled the window's 1,024
    /// cameras and the camera was left out (issue 52).
    #[tokio::test]
    async fn a_flood_from_one_address_keeps_no_other_camera_out() {
        let peer = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let target = peer.local_addr().unwrap();
        let camera = UdpSocket::bind("127.0.0.2:0").await.unwrap();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 64 * 1024];
            let (length, from) = peer.recv_from(&mut buffer).await.unwrap();
            let probe = String::from_utf8_lossy(&buffer[..length]).into_owned();
            let id = xml::texts(&probe, &["Header", "MessageID"]).remove(0);
            for i in 0..1700 {
                let answer = match i {
                    0..500 => format!("junk {i}"),
                    _ => MATCHES
                        .replace("uuid:PROBE", &id)
                        .replace(
                            "1B4E28BA-2FA1-11D2-883F-0016D3CCA427",
                            &format!("{i:08}-0000-4000-8000-000000000000"),
                        )
                        .replace("10.0.0.11", "127.0.0.1"),
                };
                peer.send_to(answer.as_bytes(), from).await.unwrap();
                if i % 16 == 15 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            let answer = MATCHES
                .replace("uuid:PROBE", &id)
                .replace("10.0.0.11", "127.0.0.2");
            camera.send_to(answer.as_bytes(), from).await.unwrap();
        });
        let found = probe(target, Duration::from_secs(3)).await.unwrap();
        let real: Vec<_> = (found.iter())
            .filter(|c| c.service_urls == ["http://127.0.0.2/onvif/device_service"])
            .collect();
        assert_eq!(real.len(), 1, "the camera after the flood is found");
        // The peer's first 16 datagrams were junk: its budget, so none of its uuids.
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn the_probe_asks_for_network_video_transmitters() {
        let probe = message("abc");
        assert!(probe.contains("<d:Types>dn:NetworkVideoTransmitter</d:Types>"));
        assert!(probe.contains("<a:MessageID>uuid:abc</a:MessageID>"));
    }
}
