//! The runtime-manager binary: configuration (exit 2 on a bad variable), tracing, and
//! SIGTERM/Ctrl-C as the shutdown token; everything else is in the library.

use std::process::ExitCode;

use runtime_manager::config::{Config, ProcessEnv};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Config::from_env(&ProcessEnv) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("runtime-manager: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUNTIME_MANAGER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    match runtime_manager::run(config, shutdown).await {
        Ok(()) => {
            tracing::info!("runtime-manager stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error_class = e.metric_label(), "runtime-manager failed");
            eprintln!("runtime-manager: {}", e.metric_label());
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn wait_for_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
