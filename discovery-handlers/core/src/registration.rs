//! A discovery handler's registration with the node agent: the name configurations refer
//! to, where it serves `v0.DiscoveryHandler`, and whether its devices are shared between
//! nodes; and [`register`], the client call every handler makes.

use akri_proto::discovery::v0 as proto;
use proto::register_discovery_handler_request::EndpointType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// A discovery handler as it registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisteredHandler {
    /// Referenced by a configuration's `discoveryHandler.name`, e.g. `debugEcho`.
    pub name: String,
    #[serde(flatten)]
    pub endpoint: Endpoint,
    /// True when several nodes can see the same device (an IP camera).
    pub shared: bool,
}

/// Where a handler serves `v0.DiscoveryHandler`.
///
/// Serialized as the registration request spells it: `"endpointType": "UDS"` or
/// `"NETWORK"` next to `"endpoint"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "endpointType", content = "endpoint")]
pub enum Endpoint {
    /// An absolute Unix socket path.
    #[serde(rename = "UDS")]
    Uds(PathBuf),
    /// `host:port`, or a URI such as `http://host:port` (Akri's own handlers register one).
    #[serde(rename = "NETWORK")]
    Network(String),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Uds(path) => write!(f, "unix:{}", path.display()),
            Endpoint::Network(address) => f.write_str(address),
        }
    }
}

/// Why a registration request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRegistration {
    #[error("the discovery handler name is empty")]
    EmptyName,
    #[error("discovery handler name {name:?} is not usable: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("discovery handler {name}: the endpoint is empty")]
    EmptyEndpoint { name: String },
    #[error("discovery handler {name}: unknown endpoint type {value}")]
    UnknownEndpointType { name: String, value: i32 },
    #[error("discovery handler {name}: socket path {path:?} is not absolute")]
    RelativeSocket { name: String, path: String },
}

impl TryFrom<proto::RegisterDiscoveryHandlerRequest> for RegisteredHandler {
    type Error = InvalidRegistration;

    fn try_from(request: proto::RegisterDiscoveryHandlerRequest) -> Result<Self, Self::Error> {
        let name = request.name;
        if name.is_empty() {
            return Err(InvalidRegistration::EmptyName);
        }
        if let Err(reason) = akri_devices::validate_handler_name(&name) {
            return Err(InvalidRegistration::InvalidName { name, reason });
        }
        if request.endpoint.is_empty() {
            return Err(InvalidRegistration::EmptyEndpoint { name });
        }
        let endpoint = match EndpointType::try_from(request.endpoint_type) {
            Ok(EndpointType::Uds) => {
                let path = PathBuf::from(&request.endpoint);
                if !path.is_absolute() {
                    return Err(InvalidRegistration::RelativeSocket {
                        name,
                        path: request.endpoint,
                    });
                }
                Endpoint::Uds(path)
            }
            Ok(EndpointType::Network) => Endpoint::Network(request.endpoint),
            Err(_) => {
                return Err(InvalidRegistration::UnknownEndpointType {
                    name,
                    value: request.endpoint_type,
                });
            }
        };
        Ok(RegisteredHandler {
            name,
            endpoint,
            shared: request.shared,
        })
    }
}

impl From<&RegisteredHandler> for proto::RegisterDiscoveryHandlerRequest {
    fn from(handler: &RegisteredHandler) -> Self {
        let (endpoint, endpoint_type) = match &handler.endpoint {
            Endpoint::Uds(path) => (path.display().to_string(), EndpointType::Uds),
            Endpoint::Network(address) => (address.clone(), EndpointType::Network),
        };
        proto::RegisterDiscoveryHandlerRequest {
            name: handler.name.clone(),
            endpoint,
            endpoint_type: endpoint_type as i32,
            shared: handler.shared,
        }
    }
}

/// Errors of registering with the node agent.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot connect to the registration socket {path}: {cause}")]
    Connect {
        path: PathBuf,
        cause: tonic::transport::Error,
    },
    #[error("registration of discovery handler {name} refused: {status}")]
    Refused { name: String, status: tonic::Status },
}

/// Registers `handler` through the agent's registration socket
/// (`v0.Registration/RegisterDiscoveryHandler`). Registering again is harmless.
pub async fn register(
    registration_socket: &Path,
    handler: &RegisteredHandler,
) -> Result<(), RegisterError> {
    let channel = node_io::authority::connect(registration_socket)
        .await
        .map_err(|cause| RegisterError::Connect {
            path: registration_socket.to_path_buf(),
            cause,
        })?;
    proto::registration_client::RegistrationClient::new(channel)
        .register_discovery_handler(proto::RegisterDiscoveryHandlerRequest::from(handler))
        .await
        .map_err(|status| RegisterError::Refused {
            name: handler.name.clone(),
            status,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        name: &str,
        endpoint: &str,
        endpoint_type: i32,
    ) -> proto::RegisterDiscoveryHandlerRequest {
        proto::RegisterDiscoveryHandlerRequest {
            name: name.into(),
            endpoint: endpoint.into(),
            endpoint_type,
            shared: true,
        }
    }

    #[test]
    fn round_trips_both_endpoint_types() {
        for r in [
            request("udev", "/var/lib/akri/udev.sock", 0),
            request("onvif", "http://10.0.0.1:10000", 1),
        ] {
            let handler = RegisteredHandler::try_from(r.clone()).unwrap();
            assert_eq!(proto::RegisterDiscoveryHandlerRequest::from(&handler), r);
        }
    }

    #[test]
    fn refuses_bad_requests() {
        use InvalidRegistration::*;
        let check = |r| RegisteredHandler::try_from(r).unwrap_err();
        assert_eq!(check(request("", "/a.sock", 0)), EmptyName);
        assert!(matches!(check(request("x", "", 0)), EmptyEndpoint { .. }));
        assert!(matches!(
            check(request("x", "a.sock", 0)),
            RelativeSocket { .. }
        ));
        assert!(matches!(
            check(request("x", "/a.sock", 7)),
            UnknownEndpointType { value: 7, .. }
        ));
    }

    #[test]
    fn serializes_like_the_request() {
        let handler = RegisteredHandler {
            name: "debugEcho".into(),
            endpoint: Endpoint::Uds("/run/d.sock".into()),
            shared: false,
        };
        assert_eq!(
            serde_json::to_value(&handler).unwrap(),
            serde_json::json!({
                "name": "debugEcho",
                "endpointType": "UDS",
                "endpoint": "/run/d.sock",
                "shared": false,
            })
        );
        let back: RegisteredHandler =
            serde_json::from_value(serde_json::to_value(&handler).unwrap()).unwrap();
        assert_eq!(back, handler);
    }
}
