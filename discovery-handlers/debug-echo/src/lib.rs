//! The `debugEcho` discovery handler, compatible with Akri's, so the whole discovery path
//! runs without hardware: embedded in the kubelet-plugin, or standalone
//! (`akri-debug-echo-discovery-handler`).
//!
//! Discovery details are YAML, `descriptions: [foo0, foo1]`; each description is a device
//! with id = the description and the property `DEBUG_ECHO_DESCRIPTION=<description>`, as in
//! Akri. Which devices are online comes from an availability file (format in
//! [`availability`]), polled every [`DebugEchoConfig::poll_interval`]; a new list is sent
//! whenever the result changes, the first one right away.
//!
//! Embedded or not, it serves `v0.DiscoveryHandler` on its own Unix socket and registers
//! through the registration socket like any external handler.

pub mod availability;

use akri_discovery_handler::registration::{self, Endpoint, RegisteredHandler};
use akri_discovery_handler::{DeviceLists, Discover, Served, proto};
use availability::Availability;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::Status;

/// The name configurations use, as in Akri.
pub const NAME: &str = "debugEcho";
/// The property carrying a device's description, as in Akri.
pub const DESCRIPTION_PROPERTY: &str = "DEBUG_ECHO_DESCRIPTION";
/// Akri's availability file.
pub const DEFAULT_AVAILABILITY_FILE: &str = "/tmp/debug-echo-availability.txt";
/// How often the availability file is read, by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How to run the handler embedded in a process of ours.
#[derive(Clone, Debug)]
pub struct DebugEchoConfig {
    /// Where to serve `v0.DiscoveryHandler`.
    pub socket: PathBuf,
    pub availability_file: PathBuf,
    pub poll_interval: Duration,
    /// Registered as shared (devices visible from several nodes); false by default.
    pub shared: bool,
}

impl DebugEchoConfig {
    /// Serving on `socket`, with Akri's availability file, not shared.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        DebugEchoConfig {
            socket: socket.into(),
            availability_file: DEFAULT_AVAILABILITY_FILE.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            shared: false,
        }
    }
}

/// Errors of running the handler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("debugEcho: {0}")]
    Serve(akri_discovery_handler::serve::Error),
    #[error("debugEcho: {0}")]
    Register(registration::RegisterError),
}

/// A served debugEcho handler. Dropping it stops serving and removes the socket file.
#[derive(Debug)]
pub struct DebugEcho {
    handler: RegisteredHandler,
    _served: Served,
}

impl DebugEcho {
    /// Serves on `config.socket`, replacing a stale socket file. Needs a Tokio runtime.
    pub fn serve(config: DebugEchoConfig) -> Result<Self, Error> {
        let served = Served::start(
            Discovery {
                availability_file: config.availability_file,
                poll_interval: config.poll_interval,
            },
            &config.socket,
        )
        .map_err(Error::Serve)?;
        tracing::info!(socket = %config.socket.display(), shared = config.shared, "serving the debugEcho discovery handler");
        Ok(DebugEcho {
            handler: RegisteredHandler {
                name: NAME.to_string(),
                endpoint: Endpoint::Uds(config.socket),
                shared: config.shared,
            },
            _served: served,
        })
    }

    /// How it registers.
    pub fn handler(&self) -> &RegisteredHandler {
        &self.handler
    }

    /// Registers through `registration_socket`, like an external handler.
    pub async fn register(&self, registration_socket: &Path) -> Result<(), Error> {
        registration::register(registration_socket, &self.handler)
            .await
            .map_err(Error::Register)?;
        Ok(())
    }
}

/// Akri's debugEcho discovery details.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Details {
    descriptions: Vec<String>,
}

/// debugEcho's discovery: which described devices the availability file leaves online.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub availability_file: PathBuf,
    pub poll_interval: Duration,
}

impl Discover for Discovery {
    fn start(&self, request: proto::DiscoverRequest, lists: DeviceLists) -> Result<(), Status> {
        let details: Details =
            akri_discovery_handler::details::parse(NAME, &request.discovery_details)?;
        tracing::info!(descriptions = ?details.descriptions, "debugEcho Discover");
        tokio::spawn(report(details.descriptions, self.clone(), lists));
        Ok(())
    }
}

/// Sends the online devices now and whenever they change, until the agent goes away.
async fn report(descriptions: Vec<String>, discovery: Discovery, mut lists: DeviceLists) {
    loop {
        let availability = Availability::read(&discovery.availability_file).await;
        if !lists.send(devices(&descriptions, &availability)).await {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(discovery.poll_interval) => {}
            () = lists.closed() => return,
        }
    }
}

fn devices(descriptions: &[String], availability: &Availability) -> Vec<proto::Device> {
    descriptions
        .iter()
        .filter(|d| availability.is_online(d))
        .map(|description| proto::Device {
            id: description.clone(),
            properties: [(DESCRIPTION_PROPERTY.to_string(), description.clone())].into(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
        })
        .collect()
}

/// The handler as its own process (the binary's whole life after its flags), served and
/// registered as `args` say until SIGTERM; `shared`: its devices are one device on every node
/// that reports them.
pub fn run_process(
    discovery: Discovery,
    shared: bool,
    args: akri_discovery_handler::standalone::HandlerArgs,
) -> Result<(), akri_discovery_handler::standalone::Error> {
    akri_discovery_handler::standalone::run_process(|| discovery, NAME, shared, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_akris() {
        let parse = |text| akri_discovery_handler::details::parse::<Details>(NAME, text);
        let details = parse("descriptions:\n- foo0\n- \"foo1\"\n").unwrap();
        assert_eq!(details.descriptions, ["foo0", "foo1"]);
        let error = parse("").unwrap_err();
        assert!(
            error.message().contains("descriptions"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn devices_follow_availability() {
        let descriptions = vec!["foo0".to_string(), "foo1".to_string()];
        let all = devices(&descriptions, &Availability::parse(""));
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].id, "foo1");
        assert_eq!(all[1].properties[DESCRIPTION_PROPERTY], "foo1");
        let one = devices(&descriptions, &Availability::parse("foo1\n"));
        assert_eq!(
            one.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["foo0"]
        );
        assert!(devices(&descriptions, &Availability::AllOffline).is_empty());
    }
}
