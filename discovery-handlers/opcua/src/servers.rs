//! Finding servers: FindServers on each discovery URL, then which of the answers are
//! devices.

use akri_discovery_handler::{FilterList, proto};
use opcua::client::{Client, ClientBuilder};
use opcua::types::{ApplicationDescription, ApplicationType};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// OPC UA's registered port, where a URL names none.
const DEFAULT_PORT: u16 = 4840;

/// How servers are reached.
#[derive(Clone, Debug)]
pub struct Finder {
    /// The client's certificate store. FindServers needs no certificate (it runs on a
    /// SecurityPolicy None channel), but the client library keeps its trust lists here.
    pub pki_dir: PathBuf,
    /// Bound on one FindServers call, and on one reachability check.
    pub timeout: Duration,
}

impl Default for Finder {
    fn default() -> Self {
        Finder {
            pki_dir: std::env::temp_dir().join("akri-opcua-pki"),
            timeout: Duration::from_secs(5),
        }
    }
}

/// A server found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    pub discovery_url: String,
    pub application_name: String,
    pub application_uri: String,
}

impl Server {
    /// The device Akri's handler reports for it, with the name and URI besides.
    pub fn device(self) -> proto::Device {
        proto::Device {
            properties: [
                (crate::DISCOVERY_URL_PROPERTY, &self.discovery_url),
                (crate::APPLICATION_NAME_PROPERTY, &self.application_name),
                (crate::APPLICATION_URI_PROPERTY, &self.application_uri),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
            id: self.discovery_url,
            mounts: Vec::new(),
            device_specs: Vec::new(),
        }
    }
}

/// Why nothing could be found.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    #[error("OPC UA client: {0}")]
    Client(String),
    #[error("no OPC UA discovery URL answered: {0}")]
    NoAnswer(String),
}

impl Finder {
    fn client(&self) -> Result<Client, FindError> {
        ClientBuilder::new()
            .application_name("Akri OPC UA discovery handler")
            .application_uri("urn:akri:opcua-discovery-handler")
            .create_sample_keypair(false)
            .pki_dir(self.pki_dir.clone())
            .session_retry_limit(0)
            .request_timeout(self.timeout)
            .client()
            .map_err(|errors| FindError::Client(errors.join("; ")))
    }

    /// The servers the discovery URLs list, admitted by `names` and reachable, each once.
    /// An error only when no discovery URL answered at all.
    pub async fn find(
        &self,
        urls: &[url::Url],
        names: Option<&FilterList>,
    ) -> Result<Vec<Server>, FindError> {
        let client = self.client()?;
        let mut errors = Vec::new();
        let mut answered = false;
        let mut found = BTreeMap::new();
        for url in urls {
            let call = client.find_servers(url.as_str(), None, None);
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(applications)) => {
                    answered = true;
                    for application in &applications {
                        if let Some(server) = candidate(application, url, names).await {
                            found.entry(server.discovery_url.clone()).or_insert(server);
                        }
                    }
                }
                Ok(Err(error)) => errors.push(format!("{url}: {error}")),
                Err(_) => errors.push(format!("{url}: no answer within {:?}", self.timeout)),
            }
        }
        if !answered {
            return Err(FindError::NoAnswer(errors.join("; ")));
        }
        if !errors.is_empty() {
            tracing::warn!(errors = %errors.join("; "), "some OPC UA discovery URLs did not answer");
        }
        let mut checks = tokio::task::JoinSet::new();
        for server in found.into_values() {
            let timeout = self.timeout;
            checks.spawn(async move {
                reachable(&server.discovery_url, timeout)
                    .await
                    .then_some(server)
            });
        }
        let mut servers: Vec<Server> = checks.join_all().await.into_iter().flatten().collect();
        servers.sort_by(|a, b| a.discovery_url.cmp(&b.discovery_url));
        Ok(servers)
    }
}

/// The server an answer describes, if it is one the configuration wants.
async fn candidate(
    application: &ApplicationDescription,
    asked: &url::Url,
    names: Option<&FilterList>,
) -> Option<Server> {
    if !matches!(
        application.application_type,
        ApplicationType::Server | ApplicationType::ClientAndServer
    ) {
        return None;
    }
    let name = application.application_name.text.as_ref().to_string();
    if !FilterList::admits(names, &name) {
        return None;
    }
    let urls: Vec<&str> = application
        .discovery_urls
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|u| u.as_ref())
        .collect();
    let chosen = urls
        .iter()
        .find(|u| u.starts_with("opc.tcp://"))
        .or(urls.first())?;
    let discovery_url = resolvable(chosen, asked).await?;
    Some(Server {
        discovery_url,
        application_name: name,
        application_uri: application.application_uri.as_ref().to_string(),
    })
}

/// `url` as is when its host resolves; otherwise with the host of the discovery URL that
/// listed it (servers behind an LDS often name themselves by a host name only they know), as
/// Akri does.
async fn resolvable(url: &str, asked: &url::Url) -> Option<String> {
    let mut parsed = url::Url::parse(url).ok()?;
    if parsed.scheme() != "opc.tcp" {
        return None;
    }
    let host = parsed.host_str()?.to_string();
    let port = parsed.port().unwrap_or(DEFAULT_PORT);
    if tokio::net::lookup_host((host.as_str(), port)).await.is_ok() {
        return Some(url.to_string());
    }
    parsed.set_host(asked.host_str()).ok()?;
    Some(parsed.to_string())
}

/// Whether the URL's host accepts a TCP connection on its port.
async fn reachable(url: &str, timeout: Duration) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    let Some(host) = parsed.host_str() else {
        return false;
    };
    let port = parsed.port().unwrap_or(DEFAULT_PORT);
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await,
        Ok(Ok(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use opcua::types::{LocalizedText, UAString};

    fn application(name: &str, kind: ApplicationType, urls: &[&str]) -> ApplicationDescription {
        ApplicationDescription {
            application_uri: UAString::from(format!("urn:{name}")),
            application_name: LocalizedText::new("", name),
            application_type: kind,
            discovery_urls: Some(urls.iter().map(|u| UAString::from(*u)).collect()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn servers_are_devices_clients_and_discovery_servers_are_not() {
        let lds = url::Url::parse("opc.tcp://10.1.2.3:4840/").unwrap();
        let found = |a: ApplicationDescription| {
            let lds = lds.clone();
            async move { candidate(&a, &lds, None).await.map(|s| s.discovery_url) }
        };
        let url = "opc.tcp://127.0.0.1:4841/";
        assert_eq!(
            found(application("a", ApplicationType::Server, &[url]))
                .await
                .as_deref(),
            Some(url)
        );
        assert_eq!(
            found(application("a", ApplicationType::ClientAndServer, &[url]))
                .await
                .as_deref(),
            Some(url)
        );
        assert_eq!(
            found(application("a", ApplicationType::Client, &[url])).await,
            None
        );
        assert_eq!(
            found(application("a", ApplicationType::DiscoveryServer, &[url])).await,
            None
        );
        // The opc.tcp URL among several; none at all is no device.
        assert_eq!(
            found(application(
                "a",
                ApplicationType::Server,
                &["https://127.0.0.1/", url]
            ))
            .await
            .as_deref(),
            Some(url)
        );
        assert_eq!(
            found(application("a", ApplicationType::Server, &[])).await,
            None
        );
        // A host name that does not resolve takes the LDS's address.
        assert_eq!(
            found(application(
                "a",
                ApplicationType::Server,
                &["opc.tcp://plc-7.invalid:4855/x"]
            ))
            .await
            .as_deref(),
            Some("opc.tcp://10.1.2.3:4855/x")
        );
    }

    #[tokio::test]
    async fn application_names_are_filtered() {
        let lds = url::Url::parse("opc.tcp://127.0.0.1:4840/").unwrap();
        let include: FilterList = serde_yaml::from_str("items: [Boiler]").unwrap();
        let app = |name| application(name, ApplicationType::Server, &["opc.tcp://127.0.0.1:1/"]);
        assert!(
            candidate(&app("Boiler"), &lds, Some(&include))
                .await
                .is_some()
        );
        assert!(
            candidate(&app("Press"), &lds, Some(&include))
                .await
                .is_none()
        );
    }
}
