//! The worker: the binary inside a worker pod (or a local child process).
//!
//! It will dial the brain at `BRAIN_PUBLIC_URL` over WebSocket with its session token and
//! serve MCP `tools/call` (shell, files, browser). That channel is built by the worker
//! issue; this binary exists now so the workspace, images and launchers have their target.
//! Run without the channel it refuses to start, saying so.

fn main() -> std::process::ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("worker {}", env!("CARGO_PKG_VERSION"));
        return std::process::ExitCode::SUCCESS;
    }
    eprintln!(
        "worker: the tool channel is not built yet (see docs/ARCHITECTURE.md); nothing to serve"
    );
    std::process::ExitCode::from(2)
}
