//! The device service: what brokers use of a camera, asked over SOAP 1.2 with a WS-Security
//! UsernameToken (password digest) when the configuration has a credential for it.

use crate::credentials::Credential;
use crate::xml;
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha1::Digest;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest answer read from a device service; a larger one fails its call. ONVIF answers
/// to the four calls made here are a few kilobytes.
pub const MAX_RESPONSE: usize = 1024 * 1024;

const DEVICE_WSDL: &str = "http://www.onvif.org/ver10/device/wsdl";
const MEDIA_WSDL: &str = "http://www.onvif.org/ver10/media/wsdl";

/// What the device service told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    pub ip_address: Option<String>,
    pub mac_address: Option<String>,
    /// The first media profile's RTSP stream URI, any user info removed.
    pub stream_uri: Option<String>,
}

/// Why a question went unanswered. Carries no credential.
#[derive(Debug, thiserror::Error)]
#[error("{operation} at {url}: {reason}")]
pub struct QueryError {
    operation: &'static str,
    url: String,
    reason: String,
}

/// A SOAP client of device services.
#[derive(Clone, Debug)]
pub struct DeviceService {
    client: Client<HttpConnector, Full<bytes::Bytes>>,
    timeout: Duration,
}

impl DeviceService {
    pub fn new(timeout: Duration) -> Self {
        DeviceService {
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
        }
    }

    /// The camera's address and MAC (GetNetworkInterfaces), and its stream URI
    /// (GetCapabilities, GetProfiles, GetStreamUri), as far as it answers.
    pub async fn info(
        &self,
        url: &str,
        credential: Option<&Credential>,
    ) -> Result<Info, QueryError> {
        let answer = self
            .call(
                url,
                DEVICE_WSDL,
                "GetNetworkInterfaces",
                "<tds:GetNetworkInterfaces/>",
                credential,
            )
            .await?;
        let mut info = Info {
            ip_address: xml::texts(
                &answer,
                &["NetworkInterfaces", "IPv4", "Config", "*", "Address"],
            )
            .into_iter()
            .next(),
            mac_address: xml::texts(&answer, &["NetworkInterfaces", "Info", "HwAddress"])
                .into_iter()
                .next()
                .map(|m| m.to_lowercase()),
            stream_uri: None,
        };
        match self.stream_uri(url, credential).await {
            Ok(uri) => info.stream_uri = uri,
            Err(error) => tracing::debug!(%error, "no stream URI"),
        }
        Ok(info)
    }

    async fn stream_uri(
        &self,
        url: &str,
        credential: Option<&Credential>,
    ) -> Result<Option<String>, QueryError> {
        let capabilities = self
            .call(
                url,
                DEVICE_WSDL,
                "GetCapabilities",
                "<tds:GetCapabilities><tds:Category>Media</tds:Category></tds:GetCapabilities>",
                credential,
            )
            .await?;
        let Some(media) = xml::texts(&capabilities, &["Capabilities", "Media", "XAddr"])
            .into_iter()
            .next()
        else {
            return Ok(None);
        };
        // The credential goes only to the device's own address, not wherever it points.
        if crate::probe::host_of(&media).is_none_or(|host| crate::probe::host_of(url) != Some(host))
        {
            return Err(QueryError {
                operation: "GetProfiles",
                url: media,
                reason: format!("not at the device service's address ({url}); not asked"),
            });
        }
        let profiles = self
            .call(
                &media,
                MEDIA_WSDL,
                "GetProfiles",
                "<trt:GetProfiles/>",
                credential,
            )
            .await?;
        let Some(token) = xml::attributes(&profiles, &["GetProfilesResponse", "Profiles"], "token")
            .into_iter()
            .next()
        else {
            return Ok(None);
        };
        let body = format!(
            "<trt:GetStreamUri><trt:StreamSetup><tt:Stream>RTP-Unicast</tt:Stream><tt:Transport><tt:Protocol>RTSP</tt:Protocol></tt:Transport></trt:StreamSetup><trt:ProfileToken>{}</trt:ProfileToken></trt:GetStreamUri>",
            escape(&token)
        );
        let answer = self
            .call(&media, MEDIA_WSDL, "GetStreamUri", &body, credential)
            .await?;
        Ok(xml::texts(&answer, &["MediaUri", "Uri"])
            .into_iter()
            .next()
            .map(|uri| without_user_info(&uri)))
    }

    async fn call(
        &self,
        url: &str,
        wsdl: &str,
        operation: &'static str,
        body: &str,
        credential: Option<&Credential>,
    ) -> Result<String, QueryError> {
        let error = |reason: String| QueryError {
            operation,
            url: url.to_string(),
            reason,
        };
        let header = credential.map(security_header).unwrap_or_default();
        let envelope = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="{DEVICE_WSDL}" xmlns:trt="{MEDIA_WSDL}" xmlns:tt="http://www.onvif.org/ver10/schema"><s:Header>{header}</s:Header><s:Body>{body}</s:Body></s:Envelope>"#
        );
        let request = hyper::Request::post(url)
            .header(
                "Content-Type",
                format!(r#"application/soap+xml; charset=utf-8; action="{wsdl}/{operation}""#),
            )
            .body(Full::new(bytes::Bytes::from(envelope)))
            .map_err(|e| error(format!("bad URL: {e}")))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| error(with_sources(&e)))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE)
                .collect()
                .await
                .map_err(
                    |e| match e.downcast_ref::<http_body_util::LengthLimitError>() {
                        Some(_) => error(format!("an answer larger than {MAX_RESPONSE} bytes")),
                        None => error(e.to_string()),
                    },
                )?
                .to_bytes();
            Ok::<_, QueryError>((status, String::from_utf8_lossy(&body).into_owned()))
        };
        let (status, text) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| error(format!("no answer within {:?}", self.timeout)))??;
        if !status.is_success() || !xml::texts(&text, &["Body", "Fault"]).is_empty() {
            let subcode = xml::texts(&text, &["Fault", "Code", "Subcode", "Value"]).join(" ");
            let reason = xml::texts(&text, &["Fault", "Reason", "Text"]).join(" ");
            return Err(error(
                format!("HTTP {status} {subcode} {reason}")
                    .trim()
                    .to_string(),
            ));
        }
        Ok(text)
    }
}

/// WS-Security UsernameToken with the password digest:
/// base64(sha1(nonce + created + password)).
fn security_header(credential: &Credential) -> String {
    let nonce = uuid::Uuid::new_v4().into_bytes();
    let created = utc_now();
    let mut hasher = sha1::Sha1::new();
    hasher.update(nonce);
    hasher.update(created.as_bytes());
    hasher.update(credential.password.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        r#"<wsse:Security s:mustUnderstand="1" xmlns:wsse="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-secext-1.0.xsd" xmlns:wsu="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"><wsse:UsernameToken><wsse:Username>{}</wsse:Username><wsse:Password Type="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0#PasswordDigest">{}</wsse:Password><wsse:Nonce EncodingType="http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary">{}</wsse:Nonce><wsu:Created>{created}</wsu:Created></wsse:UsernameToken></wsse:Security>"#,
        escape(&credential.username),
        b64.encode(hasher.finalize()),
        b64.encode(nonce),
    )
}

/// Now in UTC, as `2026-11-25T15:04:05Z`.
fn utc_now() -> String {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// An error and its causes, `a: b: c` (hyper's own message says little: "client error
/// (SendRequest)").
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `rtsp://user:pass@host/x` -> `rtsp://host/x`: a stream URI never carries a credential
/// into properties (they become environment and Instance fields).
fn without_user_info(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_ws_securitys() {
        let header = security_header(&Credential {
            username: "admin".into(),
            password: "s3cret".into(),
        });
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce = b64.decode(&xml::texts(&header, &["Nonce"])[0]).unwrap();
        let created = &xml::texts(&header, &["Created"])[0];
        let mut hasher = sha1::Sha1::new();
        hasher.update(&nonce);
        hasher.update(created.as_bytes());
        hasher.update(b"s3cret");
        assert_eq!(
            xml::texts(&header, &["Password"])[0],
            b64.encode(hasher.finalize())
        );
        assert!(
            !header.contains("s3cret"),
            "the password itself never goes out"
        );
        assert_eq!(created.len(), "2026-11-25T15:04:05Z".len());
        assert!(
            created.starts_with("20") && created.ends_with('Z'),
            "{created}"
        );
    }

    /// A device service on `ip` that answers every call with `answer(request)` and closes;
    /// its URL and how many connections it took.
    async fn device_service(
        ip: &str,
        answer: fn(&str) -> String,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let url = format!(
            "http://{}/onvif/device_service",
            listener.local_addr().unwrap()
        );
        let taken = std::sync::Arc::<std::sync::atomic::AtomicUsize>::default();
        let count = taken.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                // Headers and the (small) body: enough to tell the call.
                while let Ok(n) = stream.read(&mut buffer).await {
                    request.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&request);
                    if n == 0 || text.contains("</s:Envelope>") {
                        break;
                    }
                }
                let body = answer(&String::from_utf8_lossy(&request));
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/soap+xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
            }
        });
        (url, taken)
    }

    fn envelope(body: &str) -> String {
        format!(
            r#"<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:tds="{DEVICE_WSDL}" xmlns:tt="http://www.onvif.org/ver10/schema"><s:Body>{body}</s:Body></s:Envelope>"#
        )
    }

    /// A camera whose capabilities name the media service at `media`; its network interface
    /// answer is ordinary.
    fn camera_pointing_at(request: &str, media: &str) -> String {
        if request.contains("GetCapabilities") {
            return envelope(&format!(
                "<tds:GetCapabilitiesResponse><tds:Capabilities><tt:Media><tt:XAddr>{media}</tt:XAddr></tt:Media></tds:Capabilities></tds:GetCapabilitiesResponse>"
            ));
        }
        envelope(
            "<tds:GetNetworkInterfacesResponse><tds:NetworkInterfaces><tt:Info><tt:HwAddress>00:11:22:33:44:55</tt:HwAddress></tt:Info><tt:IPv4><tt:Config><tt:Manual><tt:Address>10.0.0.5</tt:Address></tt:Manual></tt:Config></tt:IPv4></tds:NetworkInterfaces></tds:GetNetworkInterfacesResponse>",
        )
    }

    static MEDIA: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

    #[tokio::test]
    async fn the_credential_goes_to_a_media_service_only_at_the_devices_address() {
        let credential = Credential {
            username: "admin".into(),
            password: "s3cret".into(),
        };
        let service = DeviceService::new(Duration::from_secs(3));
        let answer: fn(&str) -> String =
            |request| camera_pointing_at(request, &MEDIA.lock().unwrap());
        // A media service elsewhere (another address of this host): never asked.
        let (elsewhere, asked_elsewhere) = device_service("127.0.0.2", |_| envelope("")).await;
        *MEDIA.lock().unwrap() = elsewhere;
        let (device, _) = device_service("127.0.0.1", answer).await;
        let info = service.info(&device, Some(&credential)).await.unwrap();
        assert_eq!(info.ip_address.as_deref(), Some("10.0.0.5"));
        assert_eq!(info.stream_uri, None);
        assert_eq!(asked_elsewhere.load(std::sync::atomic::Ordering::SeqCst), 0);
        // At the device's own address: asked.
        let (beside, asked_beside) = device_service("127.0.0.1", |_| envelope("")).await;
        *MEDIA.lock().unwrap() = beside;
        service.info(&device, Some(&credential)).await.unwrap();
        assert!(asked_beside.load(std::sync::atomic::Ordering::SeqCst) > 0);
    }

    #[tokio::test]
    async fn an_oversized_answer_fails_the_call_instead_of_being_read_whole() {
        let (device, _) = device_service("127.0.0.1", |_| "x".repeat(MAX_RESPONSE + 1)).await;
        let error = (DeviceService::new(Duration::from_secs(3))
            .info(&device, None)
            .await)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("an answer larger than 1048576 bytes"),
            "{error}"
        );
    }

    #[test]
    fn stream_uris_lose_user_info() {
        assert_eq!(
            without_user_info("rtsp://u:p@10.0.0.1:554/main"),
            "rtsp://10.0.0.1:554/main"
        );
        assert_eq!(
            without_user_info("rtsp://10.0.0.1/main"),
            "rtsp://10.0.0.1/main"
        );
    }
}
