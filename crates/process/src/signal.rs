//! Termination signals.

/// Completes on SIGTERM or SIGINT (logging which). If SIGTERM cannot be listened for, only
/// SIGINT ends it, and that is logged as an error.
pub async fn termination() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM; only SIGINT stops the process");
                let _ = tokio::signal::ctrl_c().await;
                tracing::info!("SIGINT received");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
