//! The real MCP servers of `tests/mcp/`, installed by `scripts/test-deps.sh`: a missing
//! one fails the test.

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
        Self::spawn(
            |port| {
                let mut command = std::process::Command::new("node");
                command
                    .arg(everything_js())
                    .arg("streamableHttp")
                    .env("PORT", port.to_string());
                command
            },
            "server-everything (streamableHttp)",
        )
    }

    /// Runs the command `make` builds for a port (it must listen there), its output
    /// discarded, and waits until the child itself holds the listening socket: a port from
    /// `free_port` can be taken by another test between its release and the child's bind,
    /// and then a connect would reach that other listener. A child that lost the race
    /// exits, and the next port is tried. `what` names it in a failure.
    pub fn spawn(make: impl Fn(u16) -> std::process::Command, what: &str) -> Self {
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..5 {
            let port = free_port();
            let child = make(port)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("{what} does not start ({e}): run scripts/test-deps.sh")
                });
            let mut server = Self { child, port };
            loop {
                if server.child.try_wait().unwrap().is_some() {
                    break;
                }
                if listens(server.child.id(), port) {
                    return server;
                }
                assert!(Instant::now() < deadline, "{what} never listened");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("{what} exited before listening, five times")
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// Whether process `pid` holds a socket listening on `port` (Linux: the listening
/// sockets' inodes from `/proc/<pid>/net/tcp{,6}`, matched against the process's fds).
fn listens(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(local) = fields.get(1) else { continue };
            let on_port = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                == Some(port);
            if on_port && fields.get(3) == Some(&LISTEN) {
                inodes.extend(fields.get(9).map(|inode| format!("socket:[{inode}]")));
            }
        }
    }
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
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
