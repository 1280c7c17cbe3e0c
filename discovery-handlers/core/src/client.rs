//! The agent's side of one `Discover` call, for handlers' tests and tools (the kubelet-plugin
//! has its own, reconnecting client).

use crate::proto;
use std::path::Path;

/// Calls `Discover` on the handler serving on `socket` with `details` and `properties`; the
/// stream of device lists it answers with. A socket nobody serves is `UNAVAILABLE`.
pub async fn discover(
    socket: &Path,
    details: &str,
    properties: &[(&str, &[u8])],
) -> Result<tonic::Streaming<proto::DiscoverResponse>, tonic::Status> {
    let channel = node_io::authority::connect(socket)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{}: {e}", socket.display())))?;
    let request = proto::DiscoverRequest {
        discovery_details: details.into(),
        discovery_properties: properties
            .iter()
            .map(|(name, value)| {
                let value = proto::ByteData {
                    vec: Some(value.to_vec()),
                };
                (name.to_string(), value)
            })
            .collect(),
    };
    proto::discovery_handler_client::DiscoveryHandlerClient::new(channel)
        .discover(request)
        .await
        .map(tonic::Response::into_inner)
}
