//! The worker binary: configuration, logging, then [`worker::session::run`].
//! See the library docs for the layout and `worker::exit` for the exit codes.

use std::process::ExitCode;

use worker::config::{Config, ProcessEnv, WORKER_LOG};
use worker::exit;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("worker {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // Its commands run as its user. Non-dumpable, its `/proc` files (environ with its
    // launch token, mem with every renewed one) open only to a process holding
    // CAP_SYS_PTRACE over it, which they lack.
    if let Err(err) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("worker: cannot make itself non-dumpable: {err}");
        return ExitCode::from(exit::CONFIG);
    }
    let config = match Config::from_env(&ProcessEnv) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("worker: {err}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    // wss:// uses rustls; pin its crypto provider so a build that links two never panics.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("worker: cannot start the runtime: {err}");
            return ExitCode::from(exit::CHANNEL_LOST);
        }
    };
    let code = runtime.block_on(async {
        // Inside the runtime: the trace exporter's task runs there.
        let telemetry = init_tracing();
        let code = worker::session::run(config).await;
        // The spans of the last calls are posted before the exit.
        telemetry.shutdown().await;
        code
    });
    // Handler tasks may still be parked on a pipe; the process groups are already dead.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

/// `WORKER_LOG` under the privacy cap (X4), which no filter lifts (`logging`): rmcp logs
/// whole MCP messages (arguments, results, the renewed token) and chromiumoxide CDP
/// messages (page content, typed text). Traces when the `OTEL_*` variables ask for them.
fn init_tracing() -> logging::Telemetry {
    logging::init(WORKER_LOG, "info", logging::Format::Text, "worker")
}
