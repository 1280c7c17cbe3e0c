//! What every akri binary runs with, so each `main` is flags and wiring only: one tracing
//! setup ([`init_logging`]), one `/healthz` `/readyz` `/metrics` server ([`http`]), one
//! shutdown signal ([`stopped`]).

pub mod http;

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
