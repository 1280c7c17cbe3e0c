//! The `opcua` discovery handler: OPC UA servers found through discovery URLs (a server's
//! own, or a Local Discovery Server's, which lists the servers registered with it), reported
//! as Akri's OPC UA handler reports them, so brokers written for Akri keep working.
//!
//! Discovery details, as in Akri:
//!
//! ```yaml
//! opcuaDiscoveryMethod:
//!   standard:
//!     discoveryUrls: ["opc.tcp://10.0.0.5:4840/"]   # default: opc.tcp://localhost:4840/
//! applicationNames:          # optional
//!   action: Include          # or Exclude
//!   items: [Boiler]
//! ```
//!
//! Every rescan (10 s, as Akri's) calls FindServers on each discovery URL and keeps the
//! servers among the answers (application type Server or ClientAndServer; discovery servers
//! and clients are not devices) whose application name the filter admits and that accept a
//! TCP connection (an LDS keeps listing a server that went away). Each is a device with the
//! id and property `OPCUA_DISCOVERY_URL` (its opc.tcp discovery URL; a host name that does
//! not resolve is replaced by the discovery URL's host, as Akri does), plus
//! `OPCUA_APPLICATION_NAME` and `OPCUA_APPLICATION_URI`. Devices are shared: every node that
//! reaches a server reports the same id.

mod servers;

use akri_discovery_handler::{DeviceLists, Discover, FilterList, proto};
use serde::Deserialize;
use std::time::Duration;
use tonic::Status;

pub use servers::{Finder, Server};

/// The name configurations use, as in Akri.
pub const NAME: &str = "opcua";
/// OPC UA servers are reached over the network from any node.
pub const SHARED: bool = true;
/// The server's discovery URL, as in Akri.
pub const DISCOVERY_URL_PROPERTY: &str = "OPCUA_DISCOVERY_URL";
/// The server's application name.
pub const APPLICATION_NAME_PROPERTY: &str = "OPCUA_APPLICATION_NAME";
/// The server's application URI.
pub const APPLICATION_URI_PROPERTY: &str = "OPCUA_APPLICATION_URI";
/// Akri's default discovery URL: a Local Discovery Server on the node.
pub const DEFAULT_DISCOVERY_URL: &str = "opc.tcp://localhost:4840/";

/// The handler: how it reaches servers and how often it looks again.
#[derive(Clone, Debug)]
pub struct Opcua {
    pub finder: Finder,
    pub rescan: Duration,
}

impl Default for Opcua {
    fn default() -> Self {
        Opcua {
            finder: Finder::default(),
            rescan: Duration::from_secs(10),
        }
    }
}

/// Akri's OPC UA discovery details.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Details {
    #[serde(with = "serde_yaml_singleton")]
    pub opcua_discovery_method: Method,
    #[serde(default)]
    pub application_names: Option<FilterList>,
}

/// How servers are found: only Akri's `standard` method exists.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Method {
    Standard(Standard),
}

/// Discovery URLs to call FindServers on.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Standard {
    #[serde(default = "default_discovery_urls")]
    pub discovery_urls: Vec<String>,
}

fn default_discovery_urls() -> Vec<String> {
    vec![DEFAULT_DISCOVERY_URL.to_string()]
}

/// `opcuaDiscoveryMethod: {standard: {...}}` is YAML's singleton map of an enum, as Akri's
/// serde_yaml reads it.
mod serde_yaml_singleton {
    use super::{Method, Standard};
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Map {
        standard: Option<Standard>,
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Method, D::Error> {
        match Map::deserialize(d)?.standard {
            Some(standard) => Ok(Method::Standard(standard)),
            None => Err(serde::de::Error::custom(
                "opcuaDiscoveryMethod needs `standard: {discoveryUrls: [...]}`",
            )),
        }
    }
}

impl Details {
    /// The discovery URLs, checked: at least one, each an `opc.tcp://host[:port]/...` URL.
    pub fn discovery_urls(&self) -> Result<Vec<url::Url>, String> {
        let Method::Standard(standard) = &self.opcua_discovery_method;
        if standard.discovery_urls.is_empty() {
            return Err("discoveryUrls is empty: list at least one opc.tcp:// URL".into());
        }
        standard
            .discovery_urls
            .iter()
            .map(|text| {
                let url =
                    url::Url::parse(text).map_err(|e| format!("discovery URL {text:?}: {e}"))?;
                if url.scheme() != "opc.tcp" || url.host_str().is_none() {
                    return Err(format!(
                        "discovery URL {text:?}: must be opc.tcp://<host>[:<port>]/"
                    ));
                }
                Ok(url)
            })
            .collect()
    }
}

impl Discover for Opcua {
    fn start(&self, request: proto::DiscoverRequest, lists: DeviceLists) -> Result<(), Status> {
        let details: Details =
            akri_discovery_handler::details::parse(NAME, &request.discovery_details)?;
        let urls = details
            .discovery_urls()
            .map_err(|e| Status::invalid_argument(format!("opcua discovery details: {e}")))?;
        tokio::spawn(report(urls, details.application_names, self.clone(), lists));
        Ok(())
    }
}

/// Finds the servers now and every rescan interval until the agent goes away, or until no
/// discovery URL answers (the stream then ends with that error, which the agent shows in the
/// configuration's status, and calls again after a backoff).
async fn report(
    urls: Vec<url::Url>,
    names: Option<FilterList>,
    opcua: Opcua,
    mut lists: DeviceLists,
) {
    loop {
        let found = opcua.finder.find(&urls, names.as_ref()).await;
        let devices = match found {
            Ok(servers) => servers.into_iter().map(Server::device).collect(),
            Err(error) => {
                tracing::warn!(%error, "no OPC UA discovery URL answered");
                lists.fail(Status::unavailable(error.to_string())).await;
                return;
            }
        };
        if !lists.send(devices).await {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(opcua.rescan) => {}
            () = lists.closed() => return,
        }
    }
}

/// The handler as its own process (the binary's whole life after its flags), served and
/// registered as `args` say until SIGTERM.
pub fn run_process(
    handler: Opcua,
    args: akri_discovery_handler::standalone::HandlerArgs,
) -> Result<(), akri_discovery_handler::standalone::Error> {
    akri_discovery_handler::standalone::run_process(|| handler, NAME, SHARED, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Details, Status> {
        akri_discovery_handler::details::parse(NAME, text)
    }

    #[test]
    fn akris_details_parse() {
        let details = parse(
            "opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: ['opc.tcp://10.0.0.5:4840/']\napplicationNames:\n  action: Exclude\n  items: [Boiler]\n",
        )
        .unwrap();
        assert_eq!(
            details.discovery_urls().unwrap()[0].as_str(),
            "opc.tcp://10.0.0.5:4840/"
        );
        assert!(!FilterList::admits(
            details.application_names.as_ref(),
            "Boiler"
        ));
        // Akri's default: the node's own LDS.
        let details = parse("opcuaDiscoveryMethod:\n  standard: {}\n").unwrap();
        assert_eq!(
            details.discovery_urls().unwrap()[0].as_str(),
            DEFAULT_DISCOVERY_URL
        );
    }

    #[test]
    fn bad_details_say_what_is_wrong() {
        let message = |text: &str| match parse(text) {
            Err(status) => status.message().to_string(),
            Ok(details) => details.discovery_urls().unwrap_err(),
        };
        assert!(message("").contains("opcuaDiscoveryMethod"));
        assert!(message("opcuaDiscoveryMethod: {}").contains("standard"));
        assert!(message("opcuaDiscoveryMethod: {standard: {discoveryUrls: []}}").contains("empty"));
        assert!(
            message("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://x:1/']}}")
                .contains("must be opc.tcp://")
        );
        assert!(
            message("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['not a url']}}")
                .contains("not a url")
        );
        assert!(
            message("opcuaDiscoveryMethod: {standard: {}}\napplicationNames: {action: Drop}")
                .contains("Drop")
        );
    }
}
