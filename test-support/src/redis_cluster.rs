//! Redis Clusters on loopback (O5), started from Debian's `redis-server` like the other
//! real parts: `redis-server --cluster-enabled yes` per node, then `redis-cli --cluster
//! create`.
//!
//! - [`shared`]: three masters, started once and used by every cluster test of every test
//!   process (nextest runs each test in a process of its own): a lock file under
//!   [`SHARED_DIR`] lets the first process start it and the others find it. It outlives the
//!   run, like the shared Postgres and Redis, and is started again when it no longer
//!   answers.
//! - [`RedisCluster::start`]: a cluster of a test's own, with replicas, for a test that
//!   kills a master (which would disturb the others); stopped when dropped.
//! - [`RedisCluster::start_secured`]: a cluster of a test's own that takes clients only
//!   over TLS and with a password, its nodes talking TLS to each other too.

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the shared cluster keeps its nodes' data, pid files, and ports.
pub const SHARED_DIR: &str = "/var/tmp/agent-runtime-redis-cluster";

/// How long a node waits for a silent peer before its replica takes over: short, so a
/// failover test does not wait the default 15 s.
const NODE_TIMEOUT_MS: u32 = 2000;

/// A running cluster: its nodes' ports (masters first) and data directory.
pub struct RedisCluster {
    ports: Vec<u16>,
    dir: PathBuf,
    /// Stops the nodes and removes the directory when dropped (a test's own cluster).
    owned: bool,
    secured: Option<Secured>,
}

/// What a secured cluster's clients need: the directory of `test_support::tls`'s
/// certificates (the nodes serve `server.pem`; clients trust `ca.pem`), and the password.
#[derive(Clone)]
pub struct Secured {
    pub certs: PathBuf,
    pub password: String,
}

impl Secured {
    /// `redis-cli`'s arguments to reach a node of the cluster.
    fn cli_args(&self) -> Vec<String> {
        let ca = self.certs.join("ca.pem");
        vec![
            "--tls".into(),
            "--cacert".into(),
            ca.to_str().unwrap().into(),
            "--user".into(),
            "default".into(),
            "--pass".into(),
            self.password.clone(),
            "--no-auth-warning".into(),
        ]
    }
}

/// The shared three-master cluster (see the module doc).
pub fn shared() -> RedisCluster {
    let dir = PathBuf::from(SHARED_DIR);
    fs::create_dir_all(&dir).unwrap();
    let lock = File::create(dir.join("lock")).unwrap();
    lock.lock().unwrap();
    let ports_file = dir.join("ports");
    if let Ok(ports) = fs::read_to_string(&ports_file) {
        let ports: Vec<u16> = ports.split(',').filter_map(|p| p.parse().ok()).collect();
        if !ports.is_empty() && ports.iter().all(|p| cluster_ok(None, *p)) {
            return RedisCluster {
                ports,
                dir,
                owned: false,
                secured: None,
            };
        }
        stop_nodes(&dir);
    }
    let cluster = RedisCluster::create(dir, 3, 0, false, None);
    let ports: Vec<String> = cluster.ports.iter().map(u16::to_string).collect();
    fs::write(&ports_file, ports.join(",")).unwrap();
    cluster
}

impl RedisCluster {
    /// A cluster of `masters` masters with `replicas` replicas each, of the test's own
    /// under /var/tmp, stopped when dropped.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::create(own_dir(), masters, replicas, true, None)
    }

    /// A cluster of `masters` masters, of the test's own, that serves only TLS (on each
    /// node's port, and on the cluster bus) and only to clients with `secured`'s password.
    pub fn start_secured(masters: usize, secured: Secured) -> Self {
        Self::create(own_dir(), masters, 0, true, Some(secured))
    }

    fn create(
        dir: PathBuf,
        masters: usize,
        replicas: usize,
        owned: bool,
        secured: Option<Secured>,
    ) -> Self {
        let count = masters * (1 + replicas);
        let ports = free_ports(count);
        for port in &ports {
            let node = dir.join(port.to_string());
            let _ = fs::remove_dir_all(&node);
            fs::create_dir_all(&node).unwrap();
            let mut server = Command::new("redis-server");
            match &secured {
                None => server.args(["--port", &port.to_string()]),
                Some(secured) => {
                    let file = |name: &str| secured.certs.join(name).to_str().unwrap().to_owned();
                    server
                        .args(["--port", "0", "--tls-port", &port.to_string()])
                        .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                        .args(["--tls-cert-file", &file("server.pem")])
                        .args(["--tls-key-file", &file("server.key")])
                        .args(["--tls-ca-cert-file", &file("ca.pem")])
                        .args(["--tls-auth-clients", "no"])
                        .args(["--requirepass", &secured.password])
                        .args(["--masterauth", &secured.password])
                }
            };
            let status = server
                .args(["--bind", "127.0.0.1"])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ])
                .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
                .args(["--dir", node.to_str().unwrap()])
                .args(["--pidfile", node.join("pid").to_str().unwrap()])
                .args(["--logfile", node.join("log").to_str().unwrap()])
                .status()
                .expect("redis-server (apt-get install redis-server)");
            assert!(
                status.success(),
                "redis-server on port {port} did not start"
            );
        }
        let cluster = Self {
            ports,
            dir,
            owned,
            secured,
        };
        for port in &cluster.ports {
            wait(&format!("node {port} answering"), || {
                cluster
                    .cli(*port, &["PING"])
                    .is_some_and(|out| out.contains("PONG"))
            });
        }
        let mut create = Command::new("redis-cli");
        if let Some(secured) = &cluster.secured {
            create.args(secured.cli_args());
        }
        create.arg("--cluster").arg("create");
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = create.output().unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for port in &cluster.ports {
            wait(&format!("node {port} in a healthy cluster"), || {
                cluster.ok(*port)
            });
        }
        if replicas > 0 {
            for port in &cluster.ports {
                wait(&format!("node {port} replicating"), || {
                    let info = cluster
                        .cli(*port, &["INFO", "replication"])
                        .unwrap_or_default();
                    info.contains("role:master") || info.contains("master_link_status:up")
                });
            }
        }
        cluster
    }

    /// Every node's URL, masters first: what `REDIS_CLUSTER_URLS` takes (`rediss://`
    /// with the password for a secured cluster).
    pub fn urls(&self) -> Vec<String> {
        let base = match &self.secured {
            None => "redis://".to_owned(),
            Some(secured) => format!("rediss://:{}@", secured.password),
        };
        self.ports
            .iter()
            .map(|p| format!("{base}127.0.0.1:{p}"))
            .collect()
    }

    /// Every node's port, masters first.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// `redis-cli -p port args…`'s output (over TLS and with the password on a secured
    /// cluster), or `None` if it failed.
    pub fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        cli(self.secured.as_ref(), port, args)
    }

    fn ok(&self, port: u16) -> bool {
        cluster_ok(self.secured.as_ref(), port)
    }

    /// [`Self::urls`] comma-separated.
    pub fn urls_list(&self) -> String {
        self.urls().join(",")
    }

    /// The port of the master that serves `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot: u16 = self
            .cli(self.ports[0], &["CLUSTER", "KEYSLOT", key])
            .and_then(|out| out.trim().parse().ok())
            .expect("CLUSTER KEYSLOT");
        let nodes = self
            .cli(self.ports[0], &["CLUSTER", "NODES"])
            .expect("CLUSTER NODES");
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let port: u16 = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap();
            for range in &fields[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>())
                    && (lo..=hi).contains(&slot)
                {
                    return port;
                }
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// Kills the node on `port` (SIGKILL: no goodbye to its peers), as a crash would.
    pub fn kill(&self, port: u16) {
        let pid = fs::read_to_string(self.dir.join(port.to_string()).join("pid")).unwrap();
        let status = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits until `port` no longer serves as master and the cluster is healthy again
    /// without it, as seen from every other node: its replica took its slots over.
    pub fn wait_failed_over(&self, port: u16) {
        for other in self.ports.iter().filter(|p| **p != port) {
            wait(&format!("node {other} healthy after {port} failed"), || {
                self.ok(*other)
                    && self
                        .cli(*other, &["CLUSTER", "NODES"])
                        .is_some_and(|nodes| {
                            nodes.lines().any(|line| {
                                line.contains(&format!(":{port}@")) && line.contains("fail")
                            })
                        })
            });
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if self.owned {
            stop_nodes(&self.dir);
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Stops the nodes whose pid files are under `dir` (only nodes these tests started).
fn stop_nodes(dir: &Path) {
    let Ok(nodes) = fs::read_dir(dir) else { return };
    for node in nodes.flatten() {
        if let Ok(pid) = fs::read_to_string(node.path().join("pid")) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
    }
}

/// A directory of its own under /var/tmp for a test's cluster.
fn own_dir() -> PathBuf {
    PathBuf::from(format!(
        "/var/tmp/agent-runtime-redis-cluster-{}",
        uuid::Uuid::new_v4().simple()
    ))
}

fn cluster_ok(secured: Option<&Secured>, port: u16) -> bool {
    cli(secured, port, &["CLUSTER", "INFO"]).is_some_and(|info| info.contains("cluster_state:ok"))
}

fn cli(secured: Option<&Secured>, port: u16, args: &[&str]) -> Option<String> {
    let mut command = Command::new("redis-cli");
    if let Some(secured) = secured {
        command.args(secured.cli_args());
    }
    let out = command
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Ports free on loopback now (bound, then released together so none repeats).
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    // A cluster node also listens on its port + 10000: keep both in range.
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    if ports.iter().all(|p| *p < 55_000 && port_free(p + 10_000)) {
        return ports;
    }
    drop(listeners);
    free_ports(count)
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn wait(what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Redis Cluster: timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
