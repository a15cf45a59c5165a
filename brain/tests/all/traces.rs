//! Traces (SPEC O2, X4), end to end: a real brain process, a real runtime-manager and the
//! real worker it launches export over OTLP/HTTP to a receiver inside this test, which
//! decodes every batch with the OTLP protobuf messages. Only the model is scripted.
//!
//! One turn with a worker call, under a client's `traceparent`, must be one trace: the
//! turn a child of the client's span, its model calls and tool calls children of the
//! turn, the provisioning a child of the worker tool's call and the worker's handshake a
//! child of the provisioning, and the worker's own span for the call a child of the
//! brain's `tool_call` (the context crossed the channel in the MCP request's `_meta`). The
//! brain's spans follow the OpenTelemetry GenAI conventions (P6): `invoke_agent {agent}`,
//! `chat {model}`, `execute_tool {tool}` with their `gen_ai.*` attributes. And no span,
//! attribute or event anywhere may carry the message, the system prompt, the model's
//! answer, the tool's arguments or output, a secret or a token.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::manager::{TempDir, manager_command};
use crate::common::replies::call;
use crate::common::{BrainProcess, TestApp, light_agent, read_stream};
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use protocol::ui::UiChunk;
use scripted_provider::Reply;
use serde_json::json;

/// A span as received, with the service that exported it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .map(text_of)
    }
}

/// An OTLP/HTTP receiver on loopback: `POST /v1/traces`, protobuf only.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    /// Batches received and decoded.
    batches: Arc<AtomicUsize>,
    /// Batches that were not `application/x-protobuf` or did not decode.
    refused: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let batches = Arc::new(AtomicUsize::new(0));
        let (into, refusals, counted) = (spans.clone(), refused.clone(), batches.clone());
        let app = Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| {
                let (into, refusals, counted) = (into.clone(), refusals.clone(), counted.clone());
                async move {
                    let kind = headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    if kind != "application/x-protobuf" {
                        refusals
                            .lock()
                            .unwrap()
                            .push(format!("content type {kind}"));
                        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
                    }
                    let request = match ExportTraceServiceRequest::decode(body) {
                        Ok(request) => request,
                        Err(err) => {
                            refusals.lock().unwrap().push(format!("decode: {err}"));
                            return (StatusCode::BAD_REQUEST, Vec::new());
                        }
                    };
                    let mut into = into.lock().unwrap();
                    counted.fetch_add(1, Ordering::SeqCst);
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| kv.value.as_ref())
                            .map(text_of)
                            .unwrap_or_default();
                        // The resource's attributes are checked for leaks too.
                        let resource_attrs =
                            resource.resource.map(|r| r.attributes).unwrap_or_default();
                        for scope in resource.scope_spans {
                            for mut span in scope.spans {
                                span.attributes
                                    .extend(resource_attrs.iter().map(|kv| KeyValue {
                                        key: format!("resource.{}", kv.key),
                                        ..kv.clone()
                                    }));
                                into.push(Received {
                                    service: service.clone(),
                                    span,
                                });
                            }
                        }
                    }
                    (
                        StatusCode::OK,
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url,
            spans,
            batches,
            refused,
        }
    }

    fn batches(&self) -> usize {
        self.batches.load(Ordering::SeqCst)
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until the spans received satisfy `done`.
    async fn until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within 30 s; refused batches {:?}; received {:#?}",
                self.refused.lock().unwrap(),
                summary(&spans)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn text_of(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(any_value::Value::ArrayValue(a)) => {
            a.values.iter().map(text_of).collect::<Vec<_>>().join(",")
        }
        Some(any_value::Value::KvlistValue(l)) => l
            .values
            .iter()
            .map(|kv| {
                format!(
                    "{}={}",
                    kv.key,
                    kv.value.as_ref().map(text_of).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(","),
        // A string-table index (profiles only): no text of its own.
        Some(any_value::Value::StringValueStrindex(index)) => index.to_string(),
        None => String::new(),
    }
}

fn summary(spans: &[Received]) -> Vec<String> {
    spans
        .iter()
        .map(|r| format!("{} {} {}", r.service, r.span.name, hex(&r.span.span_id)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [Received], service: &str, name: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|r| r.service == service && r.span.name == name)
        .collect()
}

/// The brain's spans of one GenAI operation (`gen_ai.operation.name`): their exported
/// names carry the agent, model or tool (P6).
fn operation<'a>(spans: &'a [Received], service: &str, operation: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|r| {
            r.service == service && r.attr("gen_ai.operation.name").as_deref() == Some(operation)
        })
        .collect()
}

/// Everything a span could leak through: its name, attributes (resource ones included),
/// events, links and status.
fn every_text(span: &Span) -> Vec<String> {
    let mut out = vec![span.name.clone(), span.trace_state.clone()];
    let kvs = |kvs: &[KeyValue], out: &mut Vec<String>| {
        for kv in kvs {
            out.push(kv.key.clone());
            out.push(kv.value.as_ref().map(text_of).unwrap_or_default());
        }
    };
    kvs(&span.attributes, &mut out);
    for event in &span.events {
        out.push(event.name.clone());
        kvs(&event.attributes, &mut out);
    }
    for link in &span.links {
        out.push(link.trace_state.clone());
        kvs(&link.attributes, &mut out);
    }
    if let Some(status) = &span.status {
        out.push(status.message.clone());
    }
    out
}

/// Posts `content` to `chat` on the brain at `url` under the client span
/// `00-{trace}-{span}-01`, and reads the whole stream.
async fn send_traced(
    app: &TestApp,
    url: &str,
    chat: &str,
    content: &str,
    trace: &str,
    span: &str,
) -> Vec<UiChunk> {
    let response = app
        .auth(
            app.http
                .post(format!("{url}/v1/chats/{chat}/messages"))
                .header("traceparent", format!("00-{trace}-{span}-01"))
                .header("tracestate", "client=1"),
        )
        .json(&json!({ "content": content }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    chunks
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_with_a_worker_call_is_one_trace_that_carries_no_text() {
    let receiver = Receiver::start().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    // Unique strings in every place text passes: the user's message, the model's answer
    // and tool arguments, the tool's output, a secret's value.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let user_marker = format!("usermarker{run}");
    let reply_marker = format!("replymarker{run}");
    let output_marker = format!("outputmarker{run}");
    let secret_marker = format!("secretmarker{run}");

    let app = TestApp::start().await;
    let namespace = format!("test-{run}");
    let secrets_key = "ab".repeat(32);
    let mut brain_env = vec![
        ("SESSION_QUEUE_NAMESPACE", namespace.as_str()),
        ("BRAIN_SECRETS_KEY", secrets_key.as_str()),
        // The shell call provisions its worker itself, so `provision` is its child; a
        // speculative start (W11) would hang it under the model call instead.
        ("BRAIN_WORKER_SPECULATION_GRACE_MS", "0"),
    ];
    brain_env.extend(otel);
    let brain = BrainProcess::start(&app, &brain_env).await;
    let workspaces = TempDir::new();
    // The local launcher passes the manager's OTEL_* on to its workers.
    let _manager = manager_command(&app, &namespace, &brain.url, &workspaces)
        .envs(otel)
        .spawn()
        .unwrap();

    let (agent, chat) = light_agent(&app).await;
    let chat = chat.as_str();

    // The command prints the output marker without holding it in its own text.
    let half = output_marker.len() / 2;
    let command = format!(
        "printf '%s%s\\n' '{}' '{}'",
        &output_marker[..half],
        &output_marker[half..]
    );
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![
            call("call_shell", "shell", json!({ "command": command })),
            call(
                "call_secret",
                "secret_set",
                json!({"name": "TRACE_SECRET", "value": secret_marker}),
            ),
        ],
        fragment: 32,
    });
    app.provider.push(Reply::Text {
        deltas: vec![reply_marker.clone()],
        delay: Duration::from_millis(1),
    });

    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let chunks = send_traced(
        &app,
        &brain.url,
        chat,
        &format!("please run it {user_marker}"),
        client_trace,
        client_span,
    )
    .await;
    // The markers really went through the turn: the shell printed one, the model said one.
    let outputs: Vec<String> = chunks
        .iter()
        .filter_map(|c| match c {
            UiChunk::ToolOutputAvailable { output, .. } => Some(output.to_string()),
            UiChunk::ToolOutputError { error_text, .. } => Some(error_text.clone()),
            _ => None,
        })
        .collect();
    assert!(
        outputs.iter().any(|o| o.contains(&output_marker)),
        "{outputs:?}"
    );
    assert!(common::streamed_text(&chunks).contains(&reply_marker));

    let spans = receiver
        .until("whole trace", |spans| {
            operation(spans, "brain", "invoke_agent").len() == 1
                && operation(spans, "brain", "chat").len() == 2
                && operation(spans, "brain", "execute_tool").len() == 2
                && named(spans, "brain", "provision").len() == 1
                && !named(spans, "brain", "channel_handshake").is_empty()
                && named(spans, "worker", "tool_call").len() == 1
        })
        .await;

    let id = |r: &Received| hex(&r.span.span_id);
    let parent = |r: &Received| hex(&r.span.parent_span_id);
    let turn = operation(&spans, "brain", "invoke_agent")[0];
    assert_eq!(hex(&turn.span.trace_id), client_trace, "the client's trace");
    assert_eq!(
        parent(turn),
        client_span,
        "the turn is a child of the client's span"
    );
    assert_eq!(turn.attr("outcome").as_deref(), Some("completed"));
    assert_eq!(turn.attr("model_calls").as_deref(), Some("2"));
    assert_eq!(turn.attr("tool_calls").as_deref(), Some("2"));
    assert_eq!(turn.attr("chat.id").as_deref(), Some(chat));
    // P6: the GenAI conventions on the agent invocation.
    assert_eq!(turn.span.name, "invoke_agent hands");
    assert_eq!(turn.attr("gen_ai.agent.name").as_deref(), Some("hands"));
    assert_eq!(
        turn.attr("gen_ai.agent.id").as_deref(),
        Some(agent.as_str())
    );
    assert_eq!(turn.attr("gen_ai.conversation.id").as_deref(), Some(chat));

    let mut summed = [0_u64; 2];
    for model_call in operation(&spans, "brain", "chat") {
        assert_eq!(parent(model_call), id(turn));
        assert_eq!(model_call.span.name, "chat gpt-test");
        assert_eq!(model_call.span.kind, SpanKind::Client as i32);
        assert_eq!(
            model_call.attr("gen_ai.provider.name").as_deref(),
            Some("openai")
        );
        assert_eq!(
            model_call.attr("gen_ai.request.model").as_deref(),
            Some("gpt-test")
        );
        assert_eq!(
            model_call.attr("gen_ai.conversation.id").as_deref(),
            Some(chat)
        );
        for (i, counted) in ["input_tokens", "output_tokens"].iter().enumerate() {
            let genai = model_call.attr(&format!("gen_ai.usage.{counted}"));
            assert_eq!(genai, model_call.attr(counted), "{counted}");
            summed[i] += genai.unwrap().parse::<u64>().unwrap();
        }
        assert_eq!(model_call.attr("route").as_deref(), Some("openai/gpt-test"));
        assert_eq!(model_call.attr("adapter").as_deref(), Some("openai"));
        assert_eq!(model_call.attr("outcome").as_deref(), Some("ok"));
        for counted in ["input_tokens", "output_tokens", "ttft_ms"] {
            let value: u64 = model_call.attr(counted).unwrap().parse().unwrap();
            assert!(counted == "ttft_ms" || value > 0, "{counted}");
        }
    }

    for (i, counted) in ["input_tokens", "output_tokens"].iter().enumerate() {
        let total: u64 = turn
            .attr(&format!("gen_ai.usage.{counted}"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(total, summed[i], "the turn's {counted} are its calls' sum");
    }

    let tool_calls = operation(&spans, "brain", "execute_tool");
    let by_tool: HashMap<String, &Received> = tool_calls
        .iter()
        .map(|r| (r.attr("tool").unwrap(), *r))
        .collect();
    let shell = by_tool["shell"];
    let secret = by_tool["secret_set"];
    for (tool_call, name, call_id) in [
        (shell, "shell", "call_shell"),
        (secret, "secret_set", "call_secret"),
    ] {
        assert_eq!(tool_call.span.name, format!("execute_tool {name}"));
        assert_eq!(tool_call.attr("gen_ai.tool.name").as_deref(), Some(name));
        assert_eq!(
            tool_call.attr("gen_ai.tool.call.id").as_deref(),
            Some(call_id)
        );
        assert_eq!(parent(tool_call), id(turn));
        assert_eq!(tool_call.attr("outcome").as_deref(), Some("ok"));
    }

    let provision = named(&spans, "brain", "provision")[0];
    assert_eq!(
        parent(provision),
        id(shell),
        "provisioning is the shell call's"
    );
    assert_eq!(provision.attr("outcome").as_deref(), Some("local"));
    assert_eq!(provision.attr("profile").as_deref(), Some("light"));
    // The worker dialing in, while the provisioning waited for it on this replica.
    let handshakes = named(&spans, "brain", "channel_handshake");
    assert_eq!(handshakes.len(), 1, "{handshakes:#?}");
    let handshake = handshakes[0];
    assert_eq!(hex(&handshake.span.trace_id), client_trace);
    assert_eq!(parent(handshake), id(provision));
    assert_eq!(handshake.attr("session.id"), provision.attr("session.id"));
    assert_eq!(handshake.attr("outcome").as_deref(), Some("ready"));

    // The worker's span for the call: the trace crossed the channel in `_meta`.
    let worker_call = named(&spans, "worker", "tool_call")[0];
    assert_eq!(hex(&worker_call.span.trace_id), client_trace);
    assert_eq!(
        parent(worker_call),
        id(shell),
        "a child of the brain's shell call"
    );
    assert_eq!(worker_call.attr("tool").as_deref(), Some("shell"));
    assert_eq!(worker_call.attr("outcome").as_deref(), Some("ok"));

    // X4, over everything received (the runtime-manager's spans and later batches too).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spans = receiver.spans();
    let forbidden = [
        user_marker.as_str(),
        reply_marker.as_str(),
        output_marker.as_str(),
        &output_marker[..half],
        &output_marker[half..],
        secret_marker.as_str(),
        // The agent's system prompt.
        "Use your shell.",
        app.key.as_str(),
        "sk-test-openai",
        "printf",
        // Any JWT: a worker's session or pool token.
        "eyJ",
    ];
    for received in &spans {
        for text in every_text(&received.span) {
            for marker in forbidden {
                assert!(
                    !text.contains(marker),
                    "{} span {} carries {marker:?}: {text:?}",
                    received.service,
                    received.span.name
                );
            }
        }
        // Only the workspace's own spans are exported, never a dependency's.
        let target = received.attr("target").unwrap_or_default();
        assert!(
            logging::OWN_TARGETS
                .iter()
                .any(|own| target == *own || target.starts_with(&format!("{own}::"))),
            "a span of {target:?}"
        );
        assert!(received.span.events.is_empty(), "events are log text");
        // The GenAI conventions' opt-in content attributes are never recorded (X4).
        for content in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
            "gen_ai.tool.definitions",
        ] {
            assert!(
                received.attr(content).is_none(),
                "{} carries {content}",
                received.span.name
            );
        }
    }
}

/// A call relayed between replicas (W4) stays in the trace: the caller's `tool_call` span
/// travels in the relay message, and the owner puts it in the worker's `_meta`.
#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_worker_call_continues_the_callers_trace() {
    let receiver = Receiver::start().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let app = TestApp::start().await;
    let namespace = format!("test-{run}");
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("SESSION_QUEUE_NAMESPACE", namespace.as_str()),
    ];
    let with_name = |name: &'static str| {
        let mut env = otel.to_vec();
        env.push(("OTEL_SERVICE_NAME", name));
        env
    };
    // The client talks to `caller`; the worker dials `owner`.
    let caller = BrainProcess::start(&app, &with_name("brain-caller")).await;
    let owner = BrainProcess::start(&app, &with_name("brain-owner")).await;
    let workspaces = TempDir::new();
    let _manager = manager_command(&app, &namespace, &owner.url, &workspaces)
        .envs(otel)
        .spawn()
        .unwrap();
    let chat = light_agent(&app).await.1;
    app.provider.push(Reply::ToolCalls {
        text: None,
        calls: vec![call(
            "call_shell",
            "shell",
            // The worker has the collector's settings; the commands it runs do not.
            json!({"command": "echo relayed; env | grep '^OTEL_' || echo no-telemetry-env"}),
        )],
        fragment: 32,
    });
    app.provider.push(Reply::Text {
        deltas: vec!["done".into()],
        delay: Duration::from_millis(1),
    });
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let chunks = send_traced(
        &app,
        &caller.url,
        &chat,
        "run it",
        trace,
        "b7ad6b7169203331",
    )
    .await;
    assert!(
        chunks.iter().any(|c| matches!(c,
            UiChunk::ToolOutputAvailable { output, .. }
                if output.to_string().contains("relayed")
                    && output.to_string().contains("no-telemetry-env"))),
        "{chunks:?}"
    );

    let spans = receiver
        .until("the relayed call's spans", |spans| {
            named(spans, "brain-caller", "provision").len() == 1
                && operation(spans, "brain-caller", "execute_tool").len() == 1
                && named(spans, "worker", "tool_call").len() == 1
        })
        .await;
    let provision = named(&spans, "brain-caller", "provision")[0];
    assert_eq!(provision.attr("outcome").as_deref(), Some("remote"));
    let shell = operation(&spans, "brain-caller", "execute_tool")[0];
    let worker_call = named(&spans, "worker", "tool_call")[0];
    assert_eq!(hex(&worker_call.span.trace_id), trace);
    assert_eq!(
        hex(&worker_call.span.parent_span_id),
        hex(&shell.span.span_id),
        "the worker's span continues the caller's tool call, through the owner"
    );
}

/// The spans still buffered at a graceful stop are posted before the process exits: with a
/// batch delay far longer than the test, the turn's span arrives only through the flush.
#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_stop_posts_the_last_spans() {
    let receiver = Receiver::start().await;
    let app = TestApp::start().await;
    let mut brain = BrainProcess::start(
        &app,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    )
    .await;
    let (_agent, chat) = app.agent_and_chat("openai/gpt-test", &[]).await;
    // Two turns, one after the other: had the exporter posted the first turn's spans on
    // its own schedule, the second would find them gone and come in a batch of its own.
    let traces = [
        "5b8aa5a2d2c872e8321cf37308d69df2",
        "6c9bb6b3e3d983f9432d048419e7ae03",
    ];
    for trace in traces {
        app.provider.push(Reply::Text {
            deltas: vec!["hello".into()],
            delay: Duration::from_millis(1),
        });
        send_traced(&app, &brain.url, &chat, "hi", trace, "051581bf3cb55c13").await;
        app.settled().await;
    }
    assert!(brain.terminate().await.success());
    let spans = receiver
        .until("the flushed turns", |spans| {
            operation(spans, "brain", "invoke_agent").len() == 2
        })
        .await;
    // The process has exited: no batch of it comes later.
    assert_eq!(receiver.batches(), 1, "one batch, the stop's flush");
    let mut turns: Vec<String> = operation(&spans, "brain", "invoke_agent")
        .iter()
        .map(|turn| hex(&turn.span.trace_id))
        .collect();
    turns.sort();
    assert_eq!(turns, traces);
    assert_eq!(operation(&spans, "brain", "chat").len(), 2);
}
