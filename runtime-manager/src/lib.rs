//! The runtime-manager: consumes the session task queue, launches workers through a
//! launcher, tears idle sessions down and reaps workers whose session ended (SPEC
//! components table, W2, W6, W7, O3).
//!
//! - `config.rs`: typed configuration from the environment.
//! - `profiles.rs`: the RuntimeProfiles (R1): built-in defaults and the profiles file.
//! - `queue` (crate): the Redis task queue the brain pushes to.
//! - `manager.rs`: the task handlers, the reaper and the start-up reconciliation.
//! - `store.rs`: every SQL statement (compare-and-set transitions of session rows).
//! - `egress.rs`: the egress proxies' configuration and ledger (W13, W14), through the
//!   `store` crate's statements the brain shares.
//! - `metrics.rs`: the Prometheus series and the `GET /metrics` listener (O2).
//! - `proxy.rs`: `runtime-manager egress-proxy`, the Kubernetes workers' shared egress
//!   proxy.
//! - `launcher/`: the `Launcher` interface, the local process launcher and the Kubernetes
//!   launcher (a Job per session, its pod watcher, `render-job`).
//!
//! **Architecture Invariant:** the manager keeps no session state in memory that another
//! replica or the next process needs: rows are the truth, tasks are in Redis, and the
//! dial timeout, the arming of idle checks and the worker-seconds billing are sweeps over
//! the rows. The exceptions are the local launcher's table
//! of its own child processes, which cannot outlive the process anyway, and the pod
//! watcher's cache of worker pods, which every replica rebuilds from the API server.
//!
//! **Architecture Invariant:** only this crate talks to the Kubernetes API.

use std::sync::Arc;

use queue::SessionQueue;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod egress;
pub mod error;
pub mod launcher;
pub mod manager;
pub mod metrics;
pub mod profiles;
pub mod proxy;
pub mod store;

pub use config::Config;
pub use error::Error;
pub use manager::Manager;

use config::LauncherKind;
use launcher::Launcher;
use launcher::kubernetes::{KubernetesLauncher, KubernetesSettings};
use launcher::local::LocalProcessLauncher;
use launcher::local_egress::LocalEgress;
use launcher::sandbox::Confinement;
use store::Store;

/// Runs the manager with the launcher `config` names until `shutdown` is cancelled. The
/// Kubernetes client comes from the environment: the pod's service account in a cluster,
/// `KUBECONFIG` or `~/.kube/config` outside.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let launcher: Arc<dyn Launcher> = match config.launcher {
        LauncherKind::Local => {
            let confinement = Confinement::detect(config.local_unconfined);
            match &confinement {
                Confinement::Confined { bwrap, .. } => {
                    tracing::info!(bwrap = %bwrap.display(), "local workers run confined")
                }
                Confinement::Unavailable(reason) => tracing::error!(
                    %reason,
                    "local workers cannot be confined: every launch fails \
                     (confinement_unavailable); install bubblewrap, or for development only \
                     set RUNTIME_MANAGER_LOCAL_UNCONFINED=true with AGENT_RUNTIME_DEV=true"
                ),
                Confinement::Unconfined => tracing::warn!(
                    "local workers run UNCONFINED (development only): each one's commands \
                     can read every workspace and every process environment of this user"
                ),
            }
            let confined = matches!(confinement, Confinement::Confined { .. });
            let launcher = LocalProcessLauncher::new(
                config.worker_bin.clone(),
                config.workspaces.clone(),
                confinement,
            );
            if confined {
                // The proxies read the sessions' egress settings through the `store` crate,
                // on a pool of their own.
                let store =
                    Store::connect(&config.database_url, config.database_behind_pooler).await?;
                let egress = LocalEgress::new(
                    ::store::Store::from_db(store.db().clone()),
                    config.egress.clone(),
                    &config.brain_public_url,
                )?;
                Arc::new(launcher.with_egress(egress))
            } else {
                Arc::new(launcher)
            }
        }
        LauncherKind::Kubernetes => {
            let client = kube::Client::try_default()
                .await
                .map_err(launcher::LaunchError::Kube)?;
            Arc::new(KubernetesLauncher::new(
                client,
                KubernetesSettings::from_config(&config),
            ))
        }
    };
    run_with_launcher(config, launcher, shutdown).await
}

/// What an operator needs to see before the manager claims anything: the settings in
/// force, and the ones that will make every launch fail or are unsafe to share.
fn announce_start(config: &Config) {
    if config.session_token_key.development {
        tracing::warn!(
            "development mode (AGENT_RUNTIME_DEV): signing worker tokens with the key kept in \
             {}; set SESSION_TOKEN_KEY (the same value for the brain) in any shared deployment",
            envcfg::DEV_KEY_FILE
        );
    }
    if config.launcher == LauncherKind::Local && !config.worker_bin.exists() {
        tracing::warn!(
            worker_bin = %config.worker_bin.display(),
            "the worker executable does not exist: every launch will fail with launch_failed \
             (build it with `cargo build --bins`, or set RUNTIME_MANAGER_WORKER_BIN)"
        );
    }
    tracing::info!(
        launcher = ?config.launcher,
        namespace = %config.kubernetes.namespace,
        worker_bin = %config.worker_bin.display(),
        workspaces = %config.workspaces.display(),
        brain_public_url = %config.brain_public_url,
        dial_timeout_ms = config.dial_timeout.as_millis() as u64,
        "runtime-manager starting"
    );
}

/// Runs the manager over `launcher` until `shutdown` is cancelled: record this replica's
/// lease and reconcile (O3), then consume tasks, renew the lease, reap and watch the
/// workers; on shutdown stop claiming, wait for the handlers in hand, stop the workers
/// that die with the manager, and remove the lease.
pub async fn run_with_launcher(
    config: Config,
    launcher: Arc<dyn Launcher>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    announce_start(&config);
    // Bound first: a taken port fails the start before anything is claimed.
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(Error::MetricsListener)?,
        ),
        None => None,
    };
    let store = Store::connect(&config.database_url, config.database_behind_pooler).await?;
    let live = store.live_sessions().await?;
    let redis = redis_conn::Client::open(&config.redis_url, config.redis_cluster_urls.as_deref())
        .map_err(queue::QueueError::from)?;
    let queue = SessionQueue::connect_with_namespace(&redis, &config.queue_namespace).await?;
    let manager = Manager::new(config, store.clone(), queue.clone(), launcher)?;
    let metrics_stop = CancellationToken::new();
    let metrics_server = metrics_listener.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "metrics serving at /metrics");
        }
        tokio::spawn(metrics::serve(
            listener,
            manager.metrics().clone(),
            store,
            queue.clone(),
            metrics_stop.clone(),
        ))
    });
    // Registered before anything is claimed: every claim names a replica with a lease.
    manager.renew_lease().await?;
    manager.reconcile().await?;

    let lease_stop = CancellationToken::new();
    let lease = tokio::spawn(manager.clone().keep_lease(lease_stop.clone()));
    let reaper_stop = CancellationToken::new();
    let reaper = tokio::spawn(manager.clone().reaper(reaper_stop.clone()));
    let watcher = tokio::spawn(manager.clone().watch_workers(reaper_stop.clone()));
    let billing = tokio::spawn(manager.clone().billing(reaper_stop.clone()));
    tracing::info!(
        replica = %manager.replica().0,
        live_sessions = live,
        "runtime-manager ready"
    );

    let handler = {
        let manager = manager.clone();
        move |task| {
            let manager = manager.clone();
            async move { manager.handle(task).await }
        }
    };
    // Stops claiming at `shutdown` and returns once the handlers in hand have finished.
    let consumed = queue::consume(queue, handler, shutdown.clone()).await;
    reaper_stop.cancel();
    let _ = reaper.await;
    let _ = watcher.await;
    let _ = billing.await;
    manager.stop_workers().await;
    // The sessions just ended get their final events now rather than from the next
    // replica's sweep.
    if let Err(e) = manager.bill_once().await {
        tracing::warn!(
            error_class = e.metric_label(),
            "billing worker-seconds failed"
        );
    }
    // Last: the lease covers every provision in hand until it has finished.
    lease_stop.cancel();
    let _ = lease.await;
    metrics_stop.cancel();
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    consumed?;
    Ok(())
}
