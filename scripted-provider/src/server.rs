//! The HTTP side: routing, recording, and playing a plan as an incremental body.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use serde_json::Value;
use tokio::sync::watch;

use crate::plan::{self, Ending, Plan, Prepared};
use crate::stream::{Ctx, Data, Event};
use crate::{RecordedRequest, Shared, Wire, anthropic, openai, responses};

pub(crate) fn spawn(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let mut stop = shared.shutdown.subscribe();
    let router = Router::new()
        .route("/v1/chat/completions", post(openai_handler))
        .route("/v1/messages", post(anthropic_handler))
        .route("/v1/responses", post(responses_handler))
        .route("/v1/embeddings", post(crate::embeddings::handler))
        .fallback(not_found)
        // Long agent histories exceed axum's 2 MB default; real providers accept them.
        .layer(DefaultBodyLimit::disable())
        .with_state(shared);
    // Each event is written the moment it is due, as a real provider's edge does; with
    // Nagle on, an event written while the previous one is not yet acknowledged would wait
    // for the client's delayed ACK (up to 40 ms).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let signal = async move {
            // The sender lives in `Shared`, owned by this very server, so only an
            // explicit shutdown ends this wait.
            let _ = stop.wait_for(|stopped| *stopped).await;
        };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(signal)
            .await
        {
            tracing::warn!(error = %e, "scripted provider server ended with an error");
        }
    });
}

async fn not_found() -> Response {
    let body = serde_json::json!({
        "error": {"message": "Unknown endpoint.", "type": "invalid_request_error", "param": null, "code": "unknown_url"}
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn openai_handler(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(shared, Wire::OpenAi, headers, body).await
}

async fn anthropic_handler(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(shared, Wire::Anthropic, headers, body).await
}

async fn responses_handler(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(shared, Wire::OpenAiResponses, headers, body).await
}

async fn handle(shared: Arc<Shared>, wire: Wire, headers: HeaderMap, raw: Bytes) -> Response {
    let received_at = Instant::now();
    let auth_header = match wire {
        Wire::OpenAi | Wire::OpenAiResponses => header::AUTHORIZATION.as_str(),
        Wire::Anthropic => "x-api-key",
    };
    let authorization = headers
        .get(auth_header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let parsed: Result<Value, _> = serde_json::from_slice(&raw);
    let body = match &parsed {
        Ok(v) if v.is_object() => v.clone(),
        _ => Value::Null,
    };
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let (seq, reply, taken_at) = shared.record(RecordedRequest {
        wire,
        model: model.clone(),
        body: body.clone(),
        authorization,
        received_at,
    });
    tracing::debug!(seq, ?wire, %model, "scripted provider request");
    let Some(reply) = reply else {
        let why = match parsed {
            Err(e) => format!("The request body is not valid JSON: {e}"),
            Ok(_) => "The request body must be a JSON object.".to_string(),
        };
        return error_response(wire, 400, None, Some(&why));
    };

    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let ctx = Ctx {
        seq,
        model,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        input_tokens: plan::input_tokens(&responses::chat_view(wire, &body)),
        include_usage: body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        epoch: shared.epoch,
    };

    let (stall, plan) = match plan::prepare(reply) {
        Prepared::Status {
            status,
            retry_after,
        } => return error_response(wire, status, retry_after, None),
        Prepared::Play { stall, plan } => (stall, plan),
    };

    // A non-streamed answer only arrives once the whole generation is done, and a held
    // one once it is released.
    let (wait, held) = if stream {
        (stall, false)
    } else {
        (stall + plan.total_delay(), plan.held())
    };
    if let Err(shut_down) = generate(&shared, wire, wait, held, taken_at).await {
        return shut_down;
    }

    if !stream {
        return complete_response(wire, &plan, &ctx);
    }
    stream_response(wire, &plan, &ctx, shared, taken_at)
}

/// Stands for the time the model takes before the answer starts: `wait`, then until
/// the test releases a `held` reply. `Err` is the answer when the provider shuts down
/// meanwhile.
async fn generate(
    shared: &Arc<Shared>,
    wire: Wire,
    wait: Duration,
    held: bool,
    taken_at: u64,
) -> Result<(), Response> {
    if wait.is_zero() && !held {
        return Ok(());
    }
    // If the client hangs up while we wait, hyper drops this future and the guard
    // records the abort, just as for a dropped stream body.
    let mut guard = AbortGuard::new(shared.clone());
    let mut stop = shared.shutdown.subscribe();
    let mut released = shared.released.subscribe();
    let generated = async {
        tokio::time::sleep(wait).await;
        if held {
            // The sender lives in `Shared`, which this handler holds.
            let _ = released.wait_for(|g| *g > taken_at).await;
        }
    };
    tokio::select! {
        _ = generated => {}
        _ = stop.wait_for(|s| *s) => {
            guard.finish();
            return Err(error_response(wire, 503, None, Some("scripted provider shut down")));
        }
    }
    guard.finish();
    Ok(())
}

/// The answer as server-sent events, played at the plan's pace.
fn stream_response(
    wire: Wire,
    plan: &Plan,
    ctx: &Ctx,
    shared: Arc<Shared>,
    taken_at: u64,
) -> Response {
    let events = match wire {
        Wire::OpenAi => openai::stream_events(plan, ctx),
        Wire::Anthropic => anthropic::stream_events(plan, ctx),
        Wire::OpenAiResponses => responses::stream_events(plan, ctx),
    };
    let body = Body::from_stream(play(events, shared, taken_at));
    let mut response = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response();
    add_request_id(wire, ctx.seq, response.headers_mut());
    response
}

fn complete_response(wire: Wire, plan: &Plan, ctx: &Ctx) -> Response {
    let body = match wire {
        Wire::OpenAi => openai::complete(plan, ctx),
        Wire::Anthropic => anthropic::complete(plan, ctx),
        Wire::OpenAiResponses => responses::complete(plan, ctx),
    };
    let mut response = match plan.ending {
        Ending::Finish(_) => (StatusCode::OK, axum::Json(body)).into_response(),
        // A cut non-streamed reply is a JSON body that stops half way.
        Ending::Cut => {
            let text = body.to_string();
            let half = (0..=text.len() / 2)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let cut = text[..half].to_string();
            let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(cut)]);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        // Without a stream to break, an overload can only be reported as a status.
        Ending::Error => {
            let status = match wire {
                Wire::OpenAi | Wire::OpenAiResponses => 503,
                Wire::Anthropic => 529,
            };
            error_response(wire, status, None, None)
        }
    };
    add_request_id(wire, ctx.seq, response.headers_mut());
    response
}

pub(crate) fn error_response(
    wire: Wire,
    status: u16,
    retry_after: Option<u64>,
    message: Option<&str>,
) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match wire {
        Wire::OpenAi | Wire::OpenAiResponses => openai::error_body(code.as_u16(), message),
        Wire::Anthropic => anthropic::error_body(code.as_u16(), message),
    };
    let mut response = (code, axum::Json(body)).into_response();
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

fn add_request_id(wire: Wire, seq: usize, headers: &mut HeaderMap) {
    let (name, value) = match wire {
        Wire::OpenAi | Wire::OpenAiResponses => ("x-request-id", format!("req_scripted{seq}")),
        Wire::Anthropic => ("request-id", format!("req_scripted{seq}")),
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// Records an abort when dropped before `finish`: that is how a client hanging up shows
/// up on the server side (hyper drops the body or the handler future).
struct AbortGuard {
    shared: Arc<Shared>,
    finished: bool,
}

impl AbortGuard {
    fn new(shared: Arc<Shared>) -> AbortGuard {
        AbortGuard {
            shared,
            finished: false,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.record_abort(Instant::now());
        }
    }
}

struct Player {
    events: VecDeque<Event>,
    guard: AbortGuard,
    stop: watch::Receiver<bool>,
    released: watch::Receiver<u64>,
    /// The release generation when the reply was taken: later releases end its held
    /// pieces.
    taken_at: u64,
    epoch: Instant,
}

/// What ended the wait for an event.
enum Due {
    Now,
    Stopped,
    Released,
}

impl Player {
    /// Waits out `delay`; a `held` event's wait also ends at the release.
    async fn due(&mut self, delay: Duration, held: bool) -> Due {
        if *self.stop.borrow() {
            return Due::Stopped;
        }
        if delay.is_zero() && !held {
            return Due::Now;
        }
        let taken_at = self.taken_at;
        let released = self.released.wait_for(|g| *g > taken_at);
        tokio::select! {
            // A release or shutdown that is already there wins over a tick that is due.
            biased;
            _ = self.stop.wait_for(|s| *s) => Due::Stopped,
            _ = released, if held => Due::Released,
            _ = tokio::time::sleep(delay) => Due::Now,
        }
    }
}

/// Yields each event once its delay has passed, so every event is written the moment it
/// is due and a closed connection is noticed at once rather than after a buffered batch.
/// A stamp is taken right then; a held event repeats until the release.
fn play(
    events: Vec<Event>,
    shared: Arc<Shared>,
    taken_at: u64,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let player = Player {
        events: events.into(),
        stop: shared.shutdown.subscribe(),
        released: shared.released.subscribe(),
        taken_at,
        epoch: shared.epoch,
        guard: AbortGuard::new(shared),
    };
    futures_util::stream::unfold(player, |mut p| async move {
        loop {
            let Some(event) = p.events.pop_front() else {
                p.guard.finish();
                return None;
            };
            let held = matches!(event.data, Data::Held(_));
            match p.due(event.delay, held).await {
                Due::Now => {}
                // The held repeats are over: go on with what follows them.
                Due::Released => continue,
                Due::Stopped => {
                    // Shutdown is not the client going away; end the connection without
                    // a clean terminator, as a provider outage would.
                    p.guard.finish();
                    p.events.clear();
                    return Some((Err(std::io::Error::other("scripted provider shut down")), p));
                }
            }
            let data = match &event.data {
                Data::Fixed(bytes) | Data::Held(bytes) => bytes.clone(),
                Data::Stamp(render) => Bytes::from(render(&plan::stamp(p.epoch))),
            };
            if held {
                p.events.push_front(event);
            }
            if p.events.is_empty() {
                p.guard.finish();
            }
            return Some((Ok(data), p));
        }
    })
}
