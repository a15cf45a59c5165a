//! The real MCP servers of `tests/mcp/`, installed by `scripts/test-deps.sh`: a missing
//! one fails the test.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mcp")
        .canonicalize()
        .expect("tests/mcp exists")
}

pub fn installed(path: PathBuf) -> String {
    assert!(
        path.exists(),
        "{} is missing: run scripts/test-deps.sh",
        path.display()
    );
    path.to_str().unwrap().to_owned()
}

pub fn everything_js() -> String {
    installed(mcp_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js"))
}

/// An MCP server over streamable HTTP on a loopback port of its own (at `/mcp`); killed
/// by pid on drop.
pub struct HttpServer {
    child: std::process::Child,
    pub port: u16,
}

impl HttpServer {
    /// server-everything in streamable HTTP mode.
    pub fn everything() -> Self {
        let port = free_port();
        let mut command = std::process::Command::new("node");
        command
            .arg(everything_js())
            .arg("streamableHttp")
            .env("PORT", port.to_string());
        Self::spawn(command, port, "server-everything (streamableHttp)")
    }

    /// Runs `command` (which must listen on `port`), its output discarded, and waits until
    /// the port accepts; `what` names it in a failure.
    pub fn spawn(mut command: std::process::Command, port: u16, what: &str) -> Self {
        let child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{what} does not start ({e}): run scripts/test-deps.sh"));
        let mut server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "{what} exited before listening"
            );
            assert!(Instant::now() < deadline, "{what} never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
