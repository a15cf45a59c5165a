//! The `/metrics` listener (SPEC O2): a port of its own, apart from the API, so a scrape
//! never competes with requests for the API's limits.

use engine::metrics::Metrics;

/// Serves `GET /metrics` (and nothing else) on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .with_state(metrics);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Prometheus text format 0.0.4 (SPEC O2). Counts and closed labels only (X4).
async fn scrape(
    axum::extract::State(metrics): axum::extract::State<Metrics>,
) -> ([(http::HeaderName, &'static str); 1], String) {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
}
