//! Leading a node: one agent per node's state directory runs the discovery-handler
//! registration socket and the embedded handlers; a rolling update's new agent stands by
//! until the old one lets go of the lock ([`Takeover`]).

use crate::config::AgentConfig;
use crate::discovery::Registry;
use crate::discovery::debug_echo::DebugEcho;
use crate::state_dir::StateDir;
use futures::future::BoxFuture;

/// Why the lead could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovery registry: {0}")]
    Registry(crate::discovery::registry::Error),
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::Error),
    #[error("embedded debugEcho: {0}")]
    DebugEcho(crate::discovery::debug_echo::Error),
    #[error(transparent)]
    Embedded(#[from] crate::embedded::Error),
}

/// How a standby agent takes the lead once the one leading the node exits: waits for its lock,
/// then serves the registration socket and the rest of [`Leader`].
pub(crate) type Takeover = BoxFuture<'static, Result<Leader, Error>>;

/// What only the leading agent of a node runs: the lock, the discovery-handler registration
/// socket and the embedded handlers (whose socket paths are the node's, not the pod's).
pub(crate) struct Leader {
    _registry: Registry,
    _debug_echo: Option<DebugEcho>,
    _embedded: Vec<akri_discovery_handler::Served>,
    /// Last (fields drop in order): the node's sockets are removed before a standby agent
    /// may take the lock and bind them again.
    _state_dir: StateDir,
}

/// Takes the lead: serves what [`Leader`] holds.
pub(crate) async fn lead(
    config: &AgentConfig,
    mut registry: Registry,
    state_dir: StateDir,
) -> Result<Leader, Error> {
    registry.serve_on().map_err(Error::Registry)?;
    let debug_echo = match &config.debug_echo {
        Some(echo) => {
            let handler = DebugEcho::serve(echo.clone()).map_err(Error::DebugEcho)?;
            handler
                .register(registry.socket())
                .await
                .map_err(Error::DebugEcho)?;
            Some(handler)
        }
        None => None,
    };
    let mut embedded = Vec::new();
    for handler in &config.embedded_handlers {
        embedded
            .push((handler.start(registry.socket(), &config.state_dir, &config.node_name)).await?);
    }
    Ok(Leader {
        _registry: registry,
        _debug_echo: debug_echo,
        _embedded: embedded,
        _state_dir: state_dir,
    })
}
