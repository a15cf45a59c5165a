//! The local process launcher: the worker binary as a child process, for a laptop, demos
//! and tests.
//!
//! Layout under the workspaces root (`RUNTIME_MANAGER_WORKSPACES`):
//!
//! ```text
//! <root>/<session id>/      the worker's workspace (WORKER_WORKSPACE, its cwd)
//! <root>/<session id>.log   the worker's stdout and stderr
//! <root>/<session id>.pid   the pid of the session's current worker
//! ```
//!
//! and `$TMPDIR/egress-<session id>/`, a confined worker's way out: its proxy's and the
//! brain's sockets (`local_egress.rs`), bound into its sandbox.
//!
//! Each worker is the leader of its own process group, so stopping it (SIGTERM to the
//! group, SIGKILL after a grace period) also ends whatever it started in that group. A
//! task per child reaps it when it exits and logs how it ended; the session row is the
//! brain's and the manager's business, not the launcher's.
//!
//! The worker gets a clean environment: `PATH`, `HOME`, `LANG` and `TMPDIR` from the
//! manager (when set) and the four `WORKER_*`/`BRAIN_PUBLIC_URL` variables, nothing else,
//! so no database URL or key of the manager ever reaches a worker; besides those, only
//! the telemetry settings of [`super::telemetry_env`]. Its session token is not among
//! them: `WORKER_SESSION_TOKEN` is `-` and the token is written to its standard input,
//! since an environment stays readable in `/proc` as long as its process lives.
//!
//! Each worker is confined ([`sandbox`]: namespaces of its own under `bwrap`, only its
//! workspace writable and visible, with `HOME` and `TMPDIR` its private `/tmp`; with
//! [`LocalProcessLauncher::with_egress`], a network namespace whose only way out is its
//! session's egress proxy and its channel to the brain, W14); where
//! that cannot be done every launch fails `confinement_unavailable`, unless the manager
//! was explicitly told to run workers unconfined (development only, warned at every
//! launch). The pid of a confined worker is that of its `bwrap`.
//!
//! A pid is only signalled when it is a child of this launcher or, for a worker left by a
//! previous manager process, when `/proc/<pid>/cmdline` shows the worker executable: a pid
//! recycled by an unrelated process is never touched.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use protocol::SessionId;
use tokio::io::AsyncWriteExt;

use super::local_egress::{LocalEgress, Sandboxed};
use super::sandbox::{self, Confinement};
use super::{LaunchError, LaunchSpec, Launcher, RunningWorker};

/// The variables a worker inherits from the manager.
const INHERITED_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];
/// SIGTERM first; SIGKILL to the group after this long.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug)]
struct Tracked {
    session: SessionId,
    /// Spawned by this process (reaped by its own task), or adopted at start (O3).
    child: bool,
    /// Its egress proxy's generation, released when the worker is gone.
    egress: Option<u64>,
}

pub struct LocalProcessLauncher {
    worker_bin: PathBuf,
    workspaces: PathBuf,
    confinement: Confinement,
    inherited_env: Vec<(String, String)>,
    /// pid → the session it serves.
    workers: Arc<Mutex<HashMap<u32, Tracked>>>,
    /// Confined workers' egress proxies; `None`: confined workers share the host's
    /// network.
    egress: Option<Arc<LocalEgress>>,
}

impl LocalProcessLauncher {
    /// `worker_bin` and `workspaces` must be absolute (the configuration makes them so).
    pub fn new(worker_bin: PathBuf, workspaces: PathBuf, confinement: Confinement) -> Self {
        let inherited_env = INHERITED_ENV
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| ((*name).to_owned(), v)))
            .chain(super::telemetry_env())
            .collect();
        Self {
            worker_bin,
            workspaces,
            confinement,
            inherited_env,
            workers: Arc::default(),
            egress: None,
        }
    }

    /// Confined workers get a network namespace of their own whose only ways out are
    /// `egress`'s proxy of their session and their channel to the brain.
    pub fn with_egress(mut self, egress: LocalEgress) -> Self {
        self.egress = Some(Arc::new(egress));
        self
    }

    /// Short, whatever the workspaces' root: a unix socket's path holds at most 107 bytes.
    fn egress_dir(&self, session: SessionId) -> PathBuf {
        std::env::temp_dir().join(format!("egress-{}", session.0.simple()))
    }

    /// The session's proxy served, for a confined worker with egress.
    async fn sandboxed(&self, session: SessionId) -> Result<Option<Sandboxed>, LaunchError> {
        let (Confinement::Confined { .. }, Some(egress)) = (&self.confinement, &self.egress) else {
            return Ok(None);
        };
        let uid = sandbox::running_as_root().then_some(sandbox::SANDBOX_UID);
        egress
            .serve(session, self.egress_dir(session), uid)
            .await
            .map(Some)
    }

    async fn release_egress(&self, session: SessionId, generation: Option<u64>) {
        if let (Some(egress), Some(generation)) = (&self.egress, generation) {
            egress.release(session, generation).await;
        }
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Tracked>> {
        self.workers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pid_file(&self, session: SessionId) -> PathBuf {
        self.workspaces.join(format!("{}.pid", session.0))
    }

    /// Whether `pid` is a live worker of ours (a tracked child, or the worker executable).
    fn is_ours(&self, pid: u32) -> bool {
        alive(pid)
            && (self.tracked().get(&pid).is_some_and(|t| t.child)
                || runs_executable(pid, &self.worker_bin))
    }

    async fn launch_inner(&self, spec: LaunchSpec) -> Result<String, LaunchError> {
        let workspace = self.prepare_workspace(&spec).await?;
        self.replace_previous(spec.session).await?;
        let sandboxed = self.sandboxed(spec.session).await?;
        let generation = sandboxed.as_ref().map(|s| s.generation);
        let spawned = match self.command(&spec, &workspace, sandboxed.as_ref()) {
            Ok(command) => self.spawn(command, &spec, generation).await,
            Err(e) => Err(e),
        };
        let (child, pid) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                self.release_egress(spec.session, generation).await;
                return Err(e);
            }
        };
        self.reap(child, pid, spec.session, generation);
        tracing::info!(session = %spec.session.0, pid, profile = %spec.profile, "worker launched");
        Ok(format!("local:{pid}"))
    }

    /// Refuses a launch that could not succeed before anything is started, and makes the
    /// session's workspace.
    async fn prepare_workspace(&self, spec: &LaunchSpec) -> Result<PathBuf, LaunchError> {
        if let Confinement::Unavailable(reason) = &self.confinement {
            return Err(LaunchError::Unconfinable(reason.clone()));
        }
        if !tokio::fs::try_exists(&self.worker_bin)
            .await
            .unwrap_or(false)
        {
            return Err(LaunchError::BinaryMissing(self.worker_bin.clone()));
        }
        let workspace = self.workspaces.join(spec.session.0.to_string());
        tokio::fs::create_dir_all(&workspace)
            .await
            .map_err(LaunchError::Workspace)?;

        Ok(workspace)
    }

    /// A worker still running for this session (a provision retried after a crash
    /// between launch and recording it) is replaced, never duplicated.
    async fn replace_previous(&self, session: SessionId) -> Result<(), LaunchError> {
        let previous: Vec<u32> = self
            .tracked()
            .iter()
            .filter(|(_, t)| t.session == session)
            .map(|(pid, _)| *pid)
            .collect();
        let from_file = tokio::fs::read_to_string(self.pid_file(session))
            .await
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        for pid in previous.into_iter().chain(from_file) {
            if self.is_ours(pid) {
                tracing::info!(session = %session.0, pid, "replacing a previous worker");
                self.stop_pid(pid).await?;
            }
        }
        Ok(())
    }

    /// The worker's command line, confined or not, with the clean environment described
    /// at the top of this file and its output going to the session's log.
    fn command(
        &self,
        spec: &LaunchSpec,
        workspace: &Path,
        sandboxed: Option<&Sandboxed>,
    ) -> Result<tokio::process::Command, LaunchError> {
        let log_path = self.workspaces.join(format!("{}.log", spec.session.0));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(LaunchError::Workspace)?;
        let log_err = log.try_clone().map_err(LaunchError::Workspace)?;

        let mut command = match &self.confinement {
            Confinement::Confined { bwrap, setsid } => {
                let mut command = tokio::process::Command::new(setsid);
                command.arg(bwrap).args(sandbox::bwrap_args(
                    &self.worker_bin,
                    workspace,
                    sandboxed.map(|s| s.dir.as_path()),
                ));
                if sandbox::running_as_root() {
                    std::os::unix::fs::chown(
                        workspace,
                        Some(sandbox::SANDBOX_UID),
                        Some(sandbox::SANDBOX_UID),
                    )
                    .map_err(LaunchError::Workspace)?;
                    command.uid(sandbox::SANDBOX_UID).gid(sandbox::SANDBOX_UID);
                }
                command
                    .env_clear()
                    .envs(self.inherited_env.iter().map(|(k, v)| (k, v)))
                    .env("HOME", "/tmp")
                    .env("TMPDIR", "/tmp");
                command
            }
            _ => {
                tracing::warn!(
                    session = %spec.session.0,
                    "launching a worker UNCONFINED (RUNTIME_MANAGER_LOCAL_UNCONFINED, development \
                     only): its commands can read every other workspace and every process \
                     environment of this user"
                );
                let mut command = tokio::process::Command::new(&self.worker_bin);
                command
                    .env_clear()
                    .envs(self.inherited_env.iter().map(|(k, v)| (k, v)))
                    .process_group(0);
                command
            }
        };
        command
            .env("BRAIN_PUBLIC_URL", &spec.brain_public_url)
            .env("WORKER_SESSION_ID", spec.session.0.to_string())
            .env("WORKER_SESSION_TOKEN", "-")
            .env("WORKER_WORKSPACE", workspace)
            // Which tool catalog the worker serves (the browser tools only in `browser`).
            .env("WORKER_PROFILE", &spec.profile)
            .env(
                "WORKER_RESTORE",
                if spec.restore { "true" } else { "false" },
            )
            // The sandbox's way out, and the brain as it is reached from inside.
            .envs(sandboxed.into_iter().flat_map(|s| s.env.iter().cloned()))
            .current_dir(workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(false);
        Ok(command)
    }

    /// Starts the worker, tracks its pid (in memory and in the pid file, for a later
    /// manager process) and hands it its token.
    async fn spawn(
        &self,
        mut command: tokio::process::Command,
        spec: &LaunchSpec,
        egress: Option<u64>,
    ) -> Result<(tokio::process::Child, u32), LaunchError> {
        let mut child = command.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LaunchError::BinaryMissing(self.worker_bin.clone()),
            _ => LaunchError::Spawn(e),
        })?;
        let Some(pid) = child.id() else {
            // Exited and reaped already: nothing to track.
            return Err(LaunchError::Spawn(std::io::Error::other(
                "worker exited at once",
            )));
        };
        self.tracked().insert(
            pid,
            Tracked {
                session: spec.session,
                child: true,
                egress,
            },
        );
        let _ = tokio::fs::write(self.pid_file(spec.session), pid.to_string()).await;
        // A worker that cannot read it exits at once (its configuration error is in its
        // log); the reaper below then ends it like any other.
        if let Some(mut stdin) = child.stdin.take()
            && let Err(e) = stdin.write_all(spec.token.as_bytes()).await
        {
            tracing::warn!(session = %spec.session.0, pid, error = %e.kind(), "the session token could not be handed over");
        }
        Ok((child, pid))
    }

    /// Reaps the child and ends whatever it left behind in its group.
    fn reap(
        &self,
        mut child: tokio::process::Child,
        pid: u32,
        session: SessionId,
        generation: Option<u64>,
    ) {
        let workers = self.workers.clone();
        let pid_file = self.pid_file(session);
        let egress = self.egress.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            if let (Some(egress), Some(generation)) = (egress, generation) {
                egress.release(session, generation).await;
            }
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            workers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&pid);
            if std::fs::read_to_string(&pid_file)
                .ok()
                .is_some_and(|s| s.trim() == pid.to_string())
            {
                let _ = std::fs::remove_file(&pid_file);
            }
            match status {
                Ok(status) => tracing::info!(
                    session = %session.0,
                    pid,
                    code = status.code(),
                    signal = status.signal(),
                    "worker exited"
                ),
                Err(e) => {
                    tracing::warn!(session = %session.0, pid, error = %e, "waiting for a worker failed")
                }
            }
        });
    }

    /// SIGTERM to the group (to the worker alone when it runs under `bwrap`), then
    /// SIGKILL to the group once the leader is gone or the grace period is over.
    /// Succeeds when the worker is (or already was) gone.
    async fn stop_pid(&self, pid: u32) -> Result<(), LaunchError> {
        if !self.is_ours(pid) {
            return Ok(());
        }
        let group = Pid::from_raw(pid as i32);
        let polite = match sandbox::innermost(pid) {
            worker if worker == pid => killpg(group, Signal::SIGTERM),
            worker => kill(Pid::from_raw(worker as i32), Signal::SIGTERM),
        };
        match polite {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(LaunchError::Signal(e)),
        }
        let deadline = Instant::now() + STOP_GRACE;
        while alive(pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if alive(pid) {
            tracing::info!(pid, "worker ignored SIGTERM; killing its group");
        }
        match killpg(group, Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(LaunchError::Signal(e)),
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while alive(pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A child is forgotten by its reaper task; an adopted worker here.
        let mut workers = self.tracked();
        if workers.get(&pid).is_some_and(|t| !t.child) {
            workers.remove(&pid);
        }
        Ok(())
    }
}

impl LocalProcessLauncher {
    /// Removes `session`'s workspace directory once its worker `stopped` is gone and no
    /// other worker of the session runs (one replaced it): a stopped worker's files are
    /// not kept, as a pod's `emptyDir` goes with its pod. Whatever it was worth keeping
    /// went into a snapshot before the stop (W10); an erased chat's workspace goes with
    /// it (L2).
    async fn discard_workspace(&self, session: SessionId, stopped: u32) {
        let replaced = self
            .tracked()
            .iter()
            .any(|(pid, t)| *pid != stopped && t.session == session && alive(*pid));
        if replaced {
            return;
        }
        let workspace = self.workspaces.join(session.0.to_string());
        match tokio::fs::remove_dir_all(&workspace).await {
            Ok(()) => tracing::info!(session = %session.0, "workspace removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(session = %session.0, error = %e.kind(), "workspace not removed")
            }
        }
    }
}

impl Launcher for LocalProcessLauncher {
    fn launch(&self, spec: LaunchSpec) -> BoxFuture<'_, Result<String, LaunchError>> {
        self.launch_inner(spec).boxed()
    }

    fn stop<'a>(&'a self, worker_ref: &'a str) -> BoxFuture<'a, Result<(), LaunchError>> {
        async move {
            let pid = parse_ref(worker_ref)?;
            let tracked = self.tracked().get(&pid).copied();
            self.stop_pid(pid).await?;
            if let Some(tracked) = tracked {
                self.discard_workspace(tracked.session, pid).await;
                self.release_egress(tracked.session, tracked.egress).await;
            }
            Ok(())
        }
        .boxed()
    }

    fn is_running<'a>(
        &'a self,
        session: SessionId,
        worker_ref: &'a str,
    ) -> BoxFuture<'a, Result<bool, LaunchError>> {
        async move {
            let pid = parse_ref(worker_ref)?;
            if !self.is_ours(pid) {
                return Ok(false);
            }
            if self.tracked().contains_key(&pid) {
                return Ok(true);
            }
            // An adopted confined worker's bridges dial its sockets by path: serve them
            // again (O3).
            let egress = if tokio::fs::try_exists(self.egress_dir(session))
                .await
                .unwrap_or(false)
            {
                self.sandboxed(session).await?.map(|s| s.generation)
            } else {
                None
            };
            self.tracked().entry(pid).or_insert(Tracked {
                session,
                child: false,
                egress,
            });
            Ok(true)
        }
        .boxed()
    }

    fn running(&self) -> BoxFuture<'_, Result<Vec<RunningWorker>, LaunchError>> {
        async move {
            let mut workers = self.tracked();
            // Adopted workers are not our children: notice their end by looking.
            workers.retain(|pid, t| {
                t.child || (alive(*pid) && runs_executable(*pid, &self.worker_bin))
            });
            Ok(workers
                .iter()
                .map(|(pid, t)| RunningWorker {
                    session: t.session,
                    worker_ref: format!("local:{pid}"),
                })
                .collect())
        }
        .boxed()
    }

    fn workers_die_with_manager(&self) -> bool {
        true
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.egress
            .iter()
            .map(|e| Box::new(e.counter()) as Box<dyn prometheus::core::Collector>)
            .collect()
    }
}

fn parse_ref(worker_ref: &str) -> Result<u32, LaunchError> {
    worker_ref
        .strip_prefix("local:")
        .and_then(|pid| pid.parse::<u32>().ok())
        .filter(|pid| *pid > 1 && *pid <= i32::MAX as u32)
        .ok_or(LaunchError::InvalidRef)
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state is the first field after the command name, which is in parentheses and
    // may itself contain spaces or parentheses.
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

/// Whether `pid` runs `executable`: as its program, as the script an interpreter runs
/// (`#!` scripts show as `<interpreter> <script>`), or as the command of `bwrap` (its
/// last argument).
fn runs_executable(pid: u32, executable: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let wanted = executable.as_os_str().as_encoded_bytes();
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    args.iter().take(2).any(|arg| *arg == wanted)
        || (args.first().is_some_and(|a| a.ends_with(b"/bwrap")) && args.last() == Some(&wanted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_refs_parse_strictly() {
        assert_eq!(parse_ref("local:1234").unwrap(), 1234);
        for bad in [
            "local:",
            "local:1",
            "local:-5",
            "k8s:job",
            "1234",
            "local:99999999999",
        ] {
            assert!(parse_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn this_process_is_alive_and_a_missing_one_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(i32::MAX as u32));
        let me = std::env::current_exe().unwrap();
        assert!(runs_executable(std::process::id(), &me));
        assert!(!runs_executable(
            std::process::id(),
            Path::new("/bin/false")
        ));
    }
}
