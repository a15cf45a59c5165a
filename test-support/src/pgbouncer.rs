//! Debian's PgBouncer (1.18: no protocol-level prepared statements) in `pool_mode =
//! transaction` in front of the test Postgres (O5), one per test that needs it: a free
//! loopback port, an ini of its own under `/var/tmp`, killed (its directory removed) on
//! drop. Clients log in without a password (`auth_type = trust`); PgBouncer logs in to
//! Postgres with the admin URL's user and password.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::db::admin_url;

/// Where Debian's package puts it (`scripts/test-deps.sh` installs it).
pub const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

pub struct PgBouncer {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl PgBouncer {
    /// A pooler lending each database at most `server_connections` server connections.
    /// With one, every client shares one server connection in turn, so whatever a
    /// transaction leaves on it (a `SET`, a lock, a statement) meets the next client.
    pub fn start(server_connections: u32) -> Self {
        assert!(
            std::path::Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: run scripts/test-deps.sh (it installs Debian's pgbouncer)"
        );
        // A free port, released for PgBouncer to bind: another process of the parallel
        // tests may take it in between, so a start that fails is tried on another port.
        for _ in 0..3 {
            if let Some(started) = Self::try_start(server_connections) {
                return started;
            }
        }
        panic!("pgbouncer exited at start, three times");
    }

    fn try_start(server_connections: u32) -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let admin = url::Url::parse(&admin_url()).unwrap();
        let dir = PathBuf::from(format!("/var/tmp/pgbouncer-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let user = admin.username();
        let password = admin.password().unwrap_or("");
        std::fs::write(
            dir.join("userlist.txt"),
            format!("\"{user}\" \"{password}\"\n"),
        )
        .unwrap();
        let ini = format!(
            "[databases]\n\
             * = host={host} port={pg_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             pool_mode = transaction\n\
             max_client_conn = 500\n\
             default_pool_size = {server_connections}\n\
             reserve_pool_size = 0\n",
            host = admin.host_str().unwrap_or("127.0.0.1"),
            pg_port = admin.port().unwrap_or(5432),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        let log = std::fs::File::create(dir.join("pgbouncer.log")).unwrap();
        let mut command = Command::new(PGBOUNCER);
        // PgBouncer refuses to run as root: as root, it is asked to become `postgres`.
        if running_as_root() {
            command.args(["-u", "postgres"]);
        }
        let mut child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("pgbouncer starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Self { port, child, dir });
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `url` (a database on the test Postgres) reached through the pooler instead.
    pub fn url_for(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
