//! The workspace's own binaries beside a test's brain: the runtime-manager that launches
//! real workers, and the directories they work in.

use std::path::PathBuf;

use super::TestApp;

/// A directory of the test's own, removed on drop, with any worker a runtime-manager
/// launched into it (see [`test_support::sandbox::kill_workers_in`]).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("brain-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        test_support::sandbox::kill_workers_in(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the workspace's binaries are: above the test's executable.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_owned()
}

/// A binary of the workspace.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The runtime-manager binary, configured to serve `app` over `namespace` with the real
/// worker binary, its workspaces in `workspaces`, its workers dialing `public_url`.
pub fn manager_command(
    app: &TestApp,
    namespace: &str,
    public_url: &str,
    workspaces: &TempDir,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(bin("runtime-manager"));
    command
        .envs(app.database_env())
        .env("REDIS_URL", redis_url())
        .env(
            "REDIS_CLUSTER_URLS",
            app.config
                .redis_cluster_urls
                .clone()
                .unwrap_or_default()
                .join(","),
        )
        .env("SESSION_QUEUE_NAMESPACE", namespace)
        .env("SESSION_TOKEN_KEY", test_support::SESSION_TOKEN_KEY)
        .env("BRAIN_PUBLIC_URL", public_url)
        .env("RUNTIME_MANAGER_WORKER_BIN", bin("worker"))
        .env("RUNTIME_MANAGER_WORKSPACES", &workspaces.0)
        .env("RUNTIME_MANAGER_LOG", "warn")
        // Tests run many managers at once: none takes the metrics port.
        .env("RUNTIME_MANAGER_METRICS_ADDR", "off")
        .kill_on_drop(true);
    command
}
