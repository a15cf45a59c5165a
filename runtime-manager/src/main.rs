//! The runtime-manager binary: configuration (exit 2 on a bad variable or profiles file),
//! tracing, and SIGTERM/Ctrl-C as the shutdown token; everything else is in the library.
//!
//! ```text
//! runtime-manager                          run (consume tasks, launch, reap, watch)
//! runtime-manager render-job --profile P   print the Job a session of profile P gets, as YAML
//! runtime-manager egress-proxy             serve the workers' shared egress proxy (proxy.rs)
//! ```

use std::process::ExitCode;

use runtime_manager::config::{Config, ProcessEnv};
use runtime_manager::launcher::kubernetes::job;
use runtime_manager::proxy::ProxyConfig;
use tokio_util::sync::CancellationToken;

const USAGE: &str =
    "usage: runtime-manager [render-job --profile light|browser|heavy|warm | egress-proxy]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Its own configuration: the proxy needs no Redis and signs no session token.
    if args == ["egress-proxy"] {
        return match ProxyConfig::from_env(&ProcessEnv) {
            Ok(config) => egress_proxy(config),
            Err(e) => {
                eprintln!("runtime-manager egress-proxy: {e}");
                ExitCode::from(2)
            }
        };
    }
    let config = match Config::from_env(&ProcessEnv) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("runtime-manager: {e}");
            return ExitCode::from(2);
        }
    };
    match args.as_slice() {
        [] => serve(config),
        ["render-job", "--profile", profile] => render_job(&config, profile),
        ["render-job", flag] if flag.starts_with("--profile=") => {
            render_job(&config, &flag["--profile=".len()..])
        }
        ["-h" | "--help" | "help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("runtime-manager: {USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Prints the Job of a sample session of `profile` (with this configuration's profiles,
/// namespace and brain URL).
fn render_job(config: &Config, profile: &str) -> ExitCode {
    let Some(sample) = job::sample(config, profile) else {
        eprintln!(
            "runtime-manager: render-job: no profile {profile:?} launches workers (one of {})",
            protocol::profile::WITH_HANDS.join(", ")
        );
        return ExitCode::from(2);
    };
    match job::to_yaml(&sample, profile) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("runtime-manager: render-job: {e}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn egress_proxy(config: ProxyConfig) -> ExitCode {
    let telemetry = logging::init(
        "RUNTIME_MANAGER_LOG",
        "info",
        logging::Format::Text,
        "egress-proxy",
    );
    let code = match runtime_manager::proxy::run(config, shutdown_on_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error_class = e.metric_label(), "egress proxy failed");
            eprintln!("runtime-manager egress-proxy: {}", e.metric_label());
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
}

/// A token cancelled at SIGTERM or Ctrl-C.
fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    shutdown
}

#[tokio::main]
async fn serve(config: Config) -> ExitCode {
    // Under the privacy cap (X4): kube logs API bodies, which hold worker tokens.
    let telemetry = logging::init(
        "RUNTIME_MANAGER_LOG",
        "info",
        logging::Format::Text,
        "runtime-manager",
    );

    let shutdown = shutdown_on_signal();
    let code = match runtime_manager::run(config, shutdown).await {
        Ok(()) => {
            tracing::info!("runtime-manager stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error_class = e.metric_label(), "runtime-manager failed");
            eprintln!("runtime-manager: {}", e.metric_label());
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown().await;
    code
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
