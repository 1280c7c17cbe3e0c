//! Discovery handlers served inside the agent's process (besides debugEcho, which has its
//! own settings): the same libraries as the handlers' own binaries, each on
//! `<handlers directory>/<name>.sock` and registered through the registration socket like an
//! external handler, so nothing downstream tells them apart.

use crate::discovery::{Endpoint, RegisteredHandler, handler};
use akri_discovery_handler::Served;
use std::path::Path;

/// A handler the agent can embed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Embedded {
    /// Local devices by udev rules (the pod needs the host's /run/udev for udev's
    /// database; /sys is every container's).
    Udev,
    /// OPC UA servers.
    Opcua,
    /// ONVIF cameras (WS-Discovery multicast: the pod needs the cameras' network).
    Onvif,
    /// Devices configurations list by hand (reads nothing but their details).
    Static,
}

/// Errors of starting an embedded handler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("embedded {name} handler: {cause}")]
    Serve {
        name: &'static str,
        cause: akri_discovery_handler::serve::Error,
    },
    #[error("embedded {name} handler: {cause}")]
    Register {
        name: &'static str,
        cause: akri_discovery_handler::registration::RegisterError,
    },
}

impl Embedded {
    /// The name configurations use.
    pub fn name(self) -> &'static str {
        match self {
            Embedded::Udev => akri_udev::NAME,
            Embedded::Opcua => akri_opcua::NAME,
            Embedded::Onvif => akri_onvif::NAME,
            Embedded::Static => akri_static::NAME,
        }
    }

    fn shared(self) -> bool {
        match self {
            Embedded::Udev => akri_udev::SHARED,
            Embedded::Opcua => akri_opcua::SHARED,
            Embedded::Onvif => akri_onvif::SHARED,
            Embedded::Static => akri_static::SHARED,
        }
    }

    /// Serves it next to the registration socket and registers it there. `state_dir` keeps
    /// what a handler writes (the OPC UA client's trust lists); `node` is this node's name
    /// (the static handler's devices list nodes).
    pub async fn start(
        self,
        registration_socket: &Path,
        state_dir: &Path,
        node: &str,
    ) -> Result<Served, Error> {
        let name = self.name();
        let socket = registration_socket.with_file_name(format!("{name}.sock"));
        let served = match self {
            Embedded::Udev => Served::start(akri_udev::Udev::start(), &socket),
            Embedded::Opcua => {
                let mut opcua = akri_opcua::Opcua::default();
                opcua.finder.pki_dir = state_dir.join("opcua-pki");
                Served::start(opcua, &socket)
            }
            Embedded::Onvif => Served::start(akri_onvif::Onvif::default(), &socket),
            Embedded::Static => Served::start(
                akri_static::Static {
                    node: node.to_string(),
                },
                &socket,
            ),
        }
        .map_err(|cause| Error::Serve { name, cause })?;
        let registered = RegisteredHandler {
            name: name.to_string(),
            endpoint: Endpoint::Uds(socket),
            shared: self.shared(),
        };
        handler::register(registration_socket, &registered)
            .await
            .map_err(|cause| Error::Register { name, cause })?;
        tracing::info!(name, "serving an embedded discovery handler");
        Ok(served)
    }
}
