//! WS-Discovery: one multicast Probe for ONVIF NetworkVideoTransmitters, and the
//! ProbeMatches that come back within the timeout.

use crate::xml;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::UdpSocket;

/// WS-Discovery's IPv4 multicast group and port.
pub const MULTICAST: &str = "239.255.255.250:3702";

/// A camera that answered.
#[derive(Clone, Debug, PartialEq, Eq)]
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

fn words(text: Option<&String>) -> Vec<String> {
    text.map(|t| t.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `urn:uuid:ABC` -> `abc`, as Akri normalizes it.
pub fn uuid_of(address: &str) -> String {
    let s = address.strip_prefix("urn:").unwrap_or(address);
    s.strip_prefix("uuid:").unwrap_or(s).to_lowercase()
}

/// Sends one probe to `target` and collects answers until `timeout`, one entry per camera.
pub async fn probe(target: SocketAddr, timeout: Duration) -> std::io::Result<Vec<Camera>> {
    let socket = UdpSocket::bind("0.0.0.0:0").await?;
    socket.set_multicast_ttl_v4(2)?;
    let id = uuid::Uuid::new_v4().to_string();
    socket.send_to(message(&id).as_bytes(), target).await?;
    let mut cameras = BTreeMap::new();
    let mut buffer = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    while let Ok(received) = tokio::time::timeout_at(deadline, socket.recv_from(&mut buffer)).await
    {
        let (length, _) = received?;
        let text = String::from_utf8_lossy(&buffer[..length]);
        for camera in parse(&text, &id) {
            cameras.entry(camera.uuid.clone()).or_insert(camera);
        }
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
    fn the_probe_asks_for_network_video_transmitters() {
        let probe = message("abc");
        assert!(probe.contains("<d:Types>dn:NetworkVideoTransmitter</d:Types>"));
        assert!(probe.contains("<a:MessageID>uuid:abc</a:MessageID>"));
    }
}
