//! What every akri binary runs with, so each `main` is flags and wiring only: one tracing
//! setup ([`init_logging`]), one `/healthz` `/readyz` `/metrics` server ([`http`]), one
//! shutdown signal ([`stopped`]), one leader elector ([`leader`]).

pub mod http;
pub mod leader;

/// A flag for an optional API-server feature: `auto` asks the API server at start (the
/// capability probes of `dra_plugin::api_support`), `on` and `off` force the answer, for
/// clusters where the probe cannot be made or an operator wants one model on every node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    #[default]
    Auto,
    On,
    Off,
}

impl Switch {
    /// The forced answer; `None` for `auto`.
    pub fn forced(self) -> Option<bool> {
        match self {
            Switch::Auto => None,
            Switch::On => Some(true),
            Switch::Off => Some(false),
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as text or as JSON lines.
pub fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// Completes on Ctrl-C or SIGTERM (what the kubelet sends before it kills a container).
pub async fn stopped() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping");
    Ok(())
}
