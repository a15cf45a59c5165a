//! `brain serve | migrate | admin create-team NAME`.

use anyhow::Context;
use engine::config::{Config, ProcessEnv};
use store::Store;
use tokio_util::sync::CancellationToken;

// A turn allocates many small, short-lived objects on every runtime thread (rows, JSON,
// chunks, keys); with glibc's allocator that was a fifth of the brain's CPU per turn
// (measured in docs/design/performance-history.md, CPU per turn).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: brain serve | brain migrate | brain admin create-team NAME";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = match Config::from_env(&ProcessEnv) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(2);
        }
    };
    let telemetry = init_tracing(config.log_json);
    let outcome = run(&args, &mut config).await;
    // After the drain: the spans of the last turns are posted before the exit.
    telemetry.shutdown().await;
    outcome
}

async fn run(args: &[String], config: &mut Config) -> anyhow::Result<()> {
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve"] => serve(config).await,
        ["migrate"] => {
            // Postgres itself: a transaction pooler carries neither `CREATE DATABASE` nor
            // the migrations' advisory lock.
            let url = config
                .database_direct_url
                .as_deref()
                .unwrap_or(&config.database_url);
            if store::create_database_if_missing(url)
                .await
                .context("creating the database")?
            {
                eprintln!("created the database");
            }
            let store = Store::connect(url, 2)
                .await
                .context("connecting to Postgres")?;
            store.check_schema().await.context("checking the schema")?;
            store.migrate().await.context("migrating")?;
            eprintln!("migrations applied");
            Ok(())
        }
        ["admin", "create-team", name] => {
            let store = Store::connect(&config.database_url, 2)
                .await
                .context("connecting to Postgres")?;
            let created = store.create_team(name).await.context("creating the team")?;
            println!("{}", serde_json::to_string(&created)?);
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

async fn serve(config: &mut Config) -> anyhow::Result<()> {
    // Kept alive for the whole process: dropping it stops the demo model.
    let _demo = if config.demo_model {
        Some(
            brain::demo::start(config)
                .await
                .context("starting the demo model")?,
        )
    } else {
        None
    };
    let store = Store::connect_configured(
        &config.database_url,
        config.database_direct_url.as_deref(),
        config.database_max_connections,
        config.database_statement_timeout,
    )
    .await
    .context("connecting to Postgres (DATABASE_URL)")?;
    store.check_schema().await.context("checking the schema")?;
    let redis =
        engine::redis::Client::open(&config.redis_url, config.redis_cluster_urls.as_deref())
            .context("REDIS_URL or REDIS_CLUSTER_URLS")?;
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("binding BRAIN_ADDR {}", config.addr))?;
    tracing::info!(addr = %config.addr, "brain listening");
    // Bound before anything runs: a taken metrics port fails the start, not a scrape later.
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding BRAIN_METRICS_ADDR {addr}"))?,
        ),
        None => None,
    };
    let state =
        brain::AppState::new(config.clone(), store, redis).context("building the shared state")?;
    // Scraped through the drain; stopped once the API has stopped.
    let metrics_stop = CancellationToken::new();
    if let Some(listener) = metrics_listener {
        tracing::info!(addr = ?config.metrics_addr, "metrics serving at /metrics");
        let served =
            brain::metrics_server::serve(listener, state.metrics.clone(), metrics_stop.clone());
        tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::warn!(error_class = "metrics_listener", error = %e, "metrics listener ended");
            }
        });
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    let served = brain::serve(listener, state, shutdown).await;
    metrics_stop.cancel();
    served?;
    tracing::info!("brain stopped");
    Ok(())
}

/// SIGTERM (Kubernetes) or Ctrl-C starts the drain.
async fn signal_shutdown(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {},
                _ = term.recv() => {},
            }
        } else {
            let _ = ctrl_c.await;
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
    shutdown.cancel();
}

/// `BRAIN_LOG` under the privacy cap (X4), which no filter lifts, and the OTLP exporter
/// when the `OTEL_*` variables configure one (`logging`).
fn init_tracing(json: bool) -> logging::Telemetry {
    let format = if json {
        logging::Format::Json
    } else {
        logging::Format::Text
    };
    logging::init("BRAIN_LOG", "info", format, "brain")
}
