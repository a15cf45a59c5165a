//! End-to-end tests over real sockets with a deliberately dumb HTTP/1.1 client, so the
//! bytes on the wire are checked, not what some client library makes of them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Reply, ScriptedProvider, ToolCall, Wire};

struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    /// OpenAI stream: the payloads of the `data:` lines.
    fn data_lines(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| b.strip_prefix("data: ").unwrap().to_string())
            .collect()
    }

    /// Anthropic stream: (event type, data) per event.
    fn events(&self) -> Vec<(String, Value)> {
        self.body
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| {
                let (event, data) = b.split_once('\n').unwrap();
                let event = event.strip_prefix("event: ").unwrap().to_string();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], event, "event name matches data type");
                (event, data)
            })
            .collect()
    }
}

fn request_bytes(path: &str, body: &Value, headers: &[(&str, &str)], close: bool) -> Vec<u8> {
    let body = body.to_string();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if close {
        req.push_str("Connection: close\r\n");
    }
    req.push_str("\r\n");
    req.push_str(&body);
    req.into_bytes()
}

async fn post(addr: SocketAddr, path: &str, body: &Value, headers: &[(&str, &str)]) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(&request_bytes(path, body, headers, true))
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> RawResponse {
    let text = String::from_utf8(raw.to_vec()).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v == "chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    RawResponse {
        status,
        headers,
        body,
    }
}

/// Decodes chunked transfer encoding; a body whose final zero chunk is missing decodes to
/// what arrived, so an aborted connection shows up as a short body.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.push_str(&tail[..size]);
        rest = &tail[size + 2..];
    }
    out
}

fn openai_body(stream: bool, include_usage: bool) -> Value {
    let mut body = json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
        "stream": stream,
    });
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn anthropic_body(stream: bool) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 100,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
        "stream": stream,
    })
}

const OPENAI: &str = "/v1/chat/completions";
const ANTHROPIC: &str = "/v1/messages";

fn text(deltas: &[&str]) -> Reply {
    Reply::Text {
        deltas: deltas.iter().map(|s| s.to_string()).collect(),
        delay: Duration::from_millis(1),
    }
}

fn calls() -> Vec<ToolCall> {
    vec![
        ToolCall {
            id: "call_1".into(),
            name: "shell".into(),
            arguments: r#"{"cmd":"ls -la","cwd":"/tmp/é"}"#.into(),
        },
        ToolCall {
            id: "call_2".into(),
            name: "read_file".into(),
            arguments: r#"{"path":"a.txt"}"#.into(),
        },
    ]
}

/// Reassembles OpenAI tool-call deltas into (id, name, arguments) per index.
fn openai_tool_calls(chunks: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for c in chunks {
        for tc in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == out.len() {
                assert_eq!(tc["type"], "function");
                out.push((
                    tc["id"].as_str().unwrap().into(),
                    tc["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            out[i]
                .2
                .push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    out
}

fn chunks(resp: &RawResponse) -> Vec<Value> {
    resp.data_lines()
        .iter()
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn openai_text_stream_ends_with_done_and_usage_when_asked() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(text(&["Hel", "lo ", "world"]));
    p.push(text(&["again"]));

    let resp = post(
        p.addr(),
        OPENAI,
        &openai_body(true, true),
        &[("Authorization", "Bearer sk-test")],
    )
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    assert!(resp.body.ends_with("data: [DONE]\n\n"), "{}", resp.body);
    let cs = chunks(&resp);
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(cs[0]["object"], "chat.completion.chunk");
    assert_eq!(cs[0]["model"], "gpt-test");
    assert!(cs[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let content: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Hello world");
    let finish = &cs[cs.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(
        cs[..cs.len() - 2]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    let usage = cs.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    // "be brief" + "hello there" = 19 chars -> 4; "Hello world" = 11 chars -> 2.
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6})
    );

    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    assert!(resp.body.ends_with("data: [DONE]\n\n"));
    let cs = chunks(&resp);
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert!(cs.iter().all(|c| c.get("usage").is_none()));

    let reqs = p.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].wire, Wire::OpenAi);
    assert_eq!(reqs[0].model, "gpt-test");
    assert_eq!(reqs[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(reqs[1].authorization, None);
    assert!(p.aborted_streams().is_empty());
    assert!(p.violations().is_empty());
}

#[tokio::test]
async fn openai_tool_calls_arrive_in_fragments() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::ToolCalls {
        text: None,
        calls: calls(),
        fragment: 5,
    });
    p.push(Reply::TruncatedToolCall {
        calls: calls(),
        fragment: 4,
    });

    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    let cs = chunks(&resp);
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    let got = openai_tool_calls(&cs);
    let want: Vec<_> = calls()
        .into_iter()
        .map(|c| (c.id, c.name, c.arguments))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        cs.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert!(resp.body.ends_with("data: [DONE]\n\n"));

    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    let cs = chunks(&resp);
    let got = openai_tool_calls(&cs);
    assert_eq!(got[0].2, calls()[0].arguments);
    let full = &calls()[1].arguments;
    assert!(full.starts_with(&got[1].2) && got[1].2.len() < full.len());
    assert_eq!(cs.last().unwrap()["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn anthropic_stream_event_order() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::ToolCalls {
        text: Some("Let me look.".into()),
        calls: calls(),
        fragment: 6,
    });
    p.push(text(&["Hi", " you"]));

    let resp = post(
        p.addr(),
        ANTHROPIC,
        &anthropic_body(true),
        &[
            ("x-api-key", "sk-ant-test"),
            ("anthropic-version", "2023-06-01"),
        ],
    )
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = resp.events();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    let mut expected = vec![
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
    ];
    let mut tool_inputs = Vec::new();
    for call in calls() {
        expected.push("content_block_start");
        let pieces = call.arguments.len().div_ceil(6);
        expected.extend(std::iter::repeat_n("content_block_delta", pieces + 1));
        expected.push("content_block_stop");
        tool_inputs.push(call.arguments);
    }
    expected.extend(["message_delta", "message_stop"]);
    assert_eq!(names, expected);

    let start = &events[0].1["message"];
    assert_eq!(start["model"], "claude-test");
    assert_eq!(start["usage"]["input_tokens"], 4);
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        events[3].1["delta"],
        json!({"type": "text_delta", "text": "Let me look."})
    );
    for (i, want) in tool_inputs.iter().enumerate() {
        let index = i + 1;
        let start = events
            .iter()
            .find(|(e, d)| e == "content_block_start" && d["index"] == index)
            .unwrap();
        assert_eq!(start.1["content_block"]["type"], "tool_use");
        assert_eq!(start.1["content_block"]["id"], calls()[i].id);
        assert_eq!(start.1["content_block"]["input"], json!({}));
        let got: String = events
            .iter()
            .filter(|(e, d)| e == "content_block_delta" && d["index"] == index)
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(&got, want);
    }
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() >= 1);

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    let events = resp.events();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_eq!(events[6].1["delta"]["stop_reason"], "end_turn");

    let reqs = p.requests();
    assert_eq!(reqs[0].wire, Wire::Anthropic);
    assert_eq!(reqs[0].authorization.as_deref(), Some("sk-ant-test"));
}

#[tokio::test]
async fn anthropic_truncated_tool_call_ends_with_max_tokens() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::TruncatedToolCall {
        calls: calls()[..1].to_vec(),
        fragment: 3,
    });
    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    let events = resp.events();
    assert_eq!(events[1].1["content_block"]["type"], "tool_use");
    let sent: String = events
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    assert!(calls()[0].arguments.starts_with(&sent));
    assert!(sent.len() < calls()[0].arguments.len());
    assert_eq!(
        events[events.len() - 2].1["delta"]["stop_reason"],
        "max_tokens"
    );
    assert_eq!(events.last().unwrap().0, "message_stop");
}

#[tokio::test]
async fn status_replies_carry_error_body_and_retry_after() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::Status {
        status: 429,
        retry_after: Some(7),
    });
    p.push(Reply::Status {
        status: 529,
        retry_after: None,
    });
    p.push(Reply::Status {
        status: 429,
        retry_after: Some(3),
    });
    p.push(Reply::Status {
        status: 500,
        retry_after: None,
    });

    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("7"));
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body["error"]["message"].is_string());
    assert!(body["error"]["type"].is_string());

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    assert_eq!(resp.status, 529);
    assert_eq!(resp.header("retry-after"), None);
    assert_eq!(resp.json()["type"], "error");
    assert_eq!(resp.json()["error"]["type"], "overloaded_error");

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("3"));
    assert_eq!(resp.json()["error"]["type"], "rate_limit_error");

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(false), &[]).await;
    assert_eq!(resp.status, 500);
    assert_eq!(resp.json()["error"]["type"], "api_error");
    assert!(resp.json()["error"]["message"].is_string());
}

#[tokio::test]
async fn cut_streams_end_without_terminator() {
    let p = ScriptedProvider::start().await.unwrap();
    let cut = Reply::Cut {
        deltas: vec!["par".into(), "tial".into()],
        delay: Duration::from_millis(1),
    };
    p.push(cut.clone());
    p.push(cut);

    let resp = post(p.addr(), OPENAI, &openai_body(true, true), &[]).await;
    assert_eq!(resp.status, 200);
    assert!(!resp.body.contains("[DONE]"));
    let cs = chunks(&resp);
    let content: String = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "partial");
    assert!(
        cs.iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    let names: Vec<String> = resp.events().into_iter().map(|(e, _)| e).collect();
    assert_eq!(names.last().unwrap(), "content_block_delta");
    assert!(
        !names
            .iter()
            .any(|n| n == "message_stop" || n == "message_delta")
    );

    // Playing the script to its end is not an abort, however the script ends.
    assert!(p.aborted_streams().is_empty());
}

#[tokio::test]
async fn stream_errors_arrive_mid_stream() {
    let p = ScriptedProvider::start().await.unwrap();
    let err = Reply::StreamError {
        deltas: vec!["so far".into()],
        delay: Duration::ZERO,
    };
    p.push(err.clone());
    p.push(err);

    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    assert_eq!(resp.status, 200);
    let lines = resp.data_lines();
    let last: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!resp.body.contains("[DONE]"));

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    let events = resp.events();
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "error");
    assert_eq!(data["error"]["type"], "overloaded_error");
    assert!(!events.iter().any(|(e, _)| e == "message_stop"));
}

#[tokio::test]
async fn client_disconnect_mid_stream_is_recorded_promptly() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::Text {
        deltas: (0..50).map(|i| format!("w{i} ")).collect(),
        delay: Duration::from_millis(20),
    });

    let mut stream = TcpStream::connect(p.addr()).await.unwrap();
    stream
        .write_all(&request_bytes(
            OPENAI,
            &openai_body(true, false),
            &[],
            false,
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("w1 ") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    let dropped = Instant::now();

    let aborted = p.wait_aborted(1, Duration::from_millis(500)).await;
    assert_eq!(aborted.len(), 1);
    let noticed = aborted[0].saturating_duration_since(dropped);
    assert!(
        noticed < Duration::from_millis(200),
        "noticed after {noticed:?}"
    );
}

#[tokio::test]
async fn stall_delays_headers_and_disconnect_during_stall_is_an_abort() {
    let p = ScriptedProvider::start().await.unwrap();
    let stall = Reply::Stall {
        delay: Duration::from_millis(80),
        deltas: vec!["late".into()],
    };
    p.push(stall.clone());
    p.push(stall);

    let started = Instant::now();
    let resp = post(p.addr(), OPENAI, &openai_body(true, false), &[]).await;
    assert!(started.elapsed() >= Duration::from_millis(80));
    assert!(resp.body.contains("\"content\":\"late\""));
    assert!(resp.body.ends_with("data: [DONE]\n\n"));
    assert!(p.aborted_streams().is_empty());

    let mut stream = TcpStream::connect(p.addr()).await.unwrap();
    stream
        .write_all(&request_bytes(ANTHROPIC, &anthropic_body(true), &[], false))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(stream);
    let aborted = p.wait_aborted(1, Duration::from_millis(500)).await;
    assert_eq!(aborted.len(), 1);
}

#[tokio::test]
async fn violations_flag_missing_tool_results_only() {
    let p = ScriptedProvider::start().await.unwrap();
    let call = json!({"id": "call_9", "type": "function", "function": {"name": "shell", "arguments": "{}"}});
    let good = json!({
        "model": "m",
        "stream": true,
        "messages": [
            {"role": "user", "content": "do it"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_9", "content": "ok"},
        ],
    });
    let resp = post(p.addr(), OPENAI, &good, &[]).await;
    assert_eq!(resp.status, 200);
    assert!(p.violations().is_empty(), "{:?}", p.violations());

    let bad = json!({
        "model": "m",
        "stream": true,
        "messages": [
            {"role": "user", "content": "do it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {}}]},
            {"role": "user", "content": "never mind"},
        ],
    });
    post(p.addr(), ANTHROPIC, &bad, &[]).await;
    let v = p.violations();
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("request #2 (anthropic)"), "{}", v[0]);
    assert!(v[0].contains("toolu_1"));
    assert!(!v[0].contains("never mind"));
}

#[tokio::test]
async fn demo_reply_echoes_the_user_text_on_both_wires() {
    let p = ScriptedProvider::start().await.unwrap();
    let long = "x".repeat(300);
    let body = json!({
        "model": "gpt-test",
        "stream": true,
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": long}]},
        ],
    });
    let resp = post(p.addr(), OPENAI, &body, &[]).await;
    let deltas: Vec<String> = chunks(&resp)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(deltas[0], "Offline demo model here. ", "four words a delta");
    assert!(deltas[..deltas.len() - 1].iter().all(|d| d.ends_with(' ')));
    let text = deltas.concat();
    assert_eq!(
        text,
        format!(
            "Offline demo model here. You said: \"{}\". I can run a command (run `ls -la`), write a file (write `hello` to `notes.txt`), read it back (read `notes.txt`), remember a note (remember `the sky is blue`) and, on an agent with the `browser` profile, take a screenshot of a page (screenshot https://example.com). Set OPENAI_API_KEY or ANTHROPIC_API_KEY to talk to a real model.",
            "x".repeat(200)
        )
    );

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(false), &[]).await;
    assert_eq!(resp.status, 200);
    let msg = resp.json();
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["stop_reason"], "end_turn");
    assert!(
        msg["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("You said: \"hello there\".")
    );
}

#[tokio::test]
async fn non_streamed_openai_completion() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(text(&["A summary", " of it."]));
    p.push(Reply::ToolCalls {
        text: None,
        calls: calls(),
        fragment: 2,
    });

    let resp = post(p.addr(), OPENAI, &openai_body(false, false), &[]).await;
    assert_eq!(resp.status, 200);
    let c = resp.json();
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(c["choices"][0]["message"]["role"], "assistant");
    assert_eq!(c["choices"][0]["message"]["content"], "A summary of it.");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["usage"]["total_tokens"], 8);

    let resp = post(p.addr(), OPENAI, &openai_body(false, false), &[]).await;
    let c = resp.json();
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(c["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(
        c["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"],
        calls()[1].arguments
    );
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let p = ScriptedProvider::start().await.unwrap();
    let addr = p.addr();
    assert_eq!(p.openai_base_url(), format!("http://{addr}/v1"));
    assert_eq!(p.anthropic_base_url(), format!("http://{addr}"));
    p.shutdown();
    refuses_connections(addr).await;

    let p = ScriptedProvider::start().await.unwrap();
    let addr = p.addr();
    let clone = p.clone();
    drop(p);
    TcpStream::connect(addr).await.unwrap();
    drop(clone);
    refuses_connections(addr).await;
}

/// A stamp's microseconds, checking its fixed width (12 digits and a space).
fn stamp_micros(text: &str) -> u128 {
    assert_eq!(text.len(), 13, "{text:?}");
    assert!(text.ends_with(' '), "{text:?}");
    text.trim_end().parse().unwrap()
}

#[tokio::test]
async fn stamped_deltas_carry_the_instant_they_were_sent() {
    let p = ScriptedProvider::start().await.unwrap();
    let delay = Duration::from_millis(20);
    for _ in 0..3 {
        p.push(Reply::Stamped { count: 3, delay });
    }
    let micros = |d: Duration| d.as_micros();

    let before = micros(p.epoch().elapsed());
    let resp = post(p.addr(), OPENAI, &openai_body(true, true), &[]).await;
    let after = micros(p.epoch().elapsed());
    assert!(resp.body.ends_with("data: [DONE]\n\n"), "{}", resp.body);
    let cs = chunks(&resp);
    let stamps: Vec<u128> = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|t| !t.is_empty())
        .map(stamp_micros)
        .collect();
    assert_eq!(stamps.len(), 3);
    // Taken when written: each after its delay, all within the request.
    assert!(stamps[0] >= before + micros(delay), "{stamps:?} {before}");
    for pair in stamps.windows(2) {
        assert!(pair[1] >= pair[0] + micros(delay), "{stamps:?}");
    }
    assert!(*stamps.last().unwrap() <= after);
    assert_eq!(cs[cs.len() - 2]["choices"][0]["finish_reason"], "stop");
    // 3 stamps of 13 characters: 39 / 4 = 9 output tokens.
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 9);

    let resp = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[]).await;
    let stamps: Vec<u128> = resp
        .events()
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| stamp_micros(d["delta"]["text"].as_str().unwrap()))
        .collect();
    assert_eq!(stamps.len(), 3);
    assert!(stamps.windows(2).all(|w| w[1] >= w[0] + micros(delay)));

    // Non-streamed: the stamps are taken when the body is built, after the delays.
    let before = micros(p.epoch().elapsed());
    let resp = post(p.addr(), OPENAI, &openai_body(false, false), &[]).await;
    let after = micros(p.epoch().elapsed());
    let text = resp.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(text.len(), 39);
    let first = stamp_micros(&text[..13]);
    assert!(first >= before + micros(delay * 3) && first <= after);
}

#[tokio::test]
async fn held_replies_tick_until_released() {
    let p = ScriptedProvider::start().await.unwrap();
    let held = || Reply::Held {
        delta: "tick ".into(),
        every: Duration::from_millis(20),
    };
    p.push(held());
    p.push(held());

    let addr = p.addr();
    let streamed =
        tokio::spawn(async move { post(addr, OPENAI, &openai_body(true, true), &[]).await });
    let complete =
        tokio::spawn(async move { post(addr, ANTHROPIC, &anthropic_body(false), &[]).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!streamed.is_finished() && !complete.is_finished());
    p.release_held();

    let resp = tokio::time::timeout(Duration::from_secs(1), streamed)
        .await
        .unwrap()
        .unwrap();
    assert!(resp.body.ends_with("data: [DONE]\n\n"), "{}", resp.body);
    let cs = chunks(&resp);
    let ticks: Vec<&str> = cs
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    // One at once, then one per 20 ms until the release (how many depends on how late
    // the timers run on a loaded machine).
    assert!(ticks.len() >= 2, "{ticks:?}");
    assert!(ticks.iter().all(|t| *t == "tick "));
    assert_eq!(cs[cs.len() - 2]["choices"][0]["finish_reason"], "stop");
    // The usage counts the delta once: "tick " is 5 characters, 1 token.
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 1);

    let resp = tokio::time::timeout(Duration::from_secs(1), complete)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["content"][0]["text"], "tick ");
    assert!(p.aborted_streams().is_empty());

    // A held reply taken after a release waits for the next one.
    p.push(held());
    let late =
        tokio::spawn(async move { post(addr, OPENAI, &openai_body(true, false), &[]).await });
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(!late.is_finished());
    p.release_held();
    let resp = tokio::time::timeout(Duration::from_secs(1), late)
        .await
        .unwrap()
        .unwrap();
    assert!(resp.body.ends_with("data: [DONE]\n\n"), "{}", resp.body);
}

async fn refuses_connections(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after shutdown");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const RESPONSES: &str = "/v1/responses";

fn responses_body(stream: bool) -> Value {
    json!({
        "model": "gpt-test",
        "instructions": "be brief",
        "input": [{"type": "message", "role": "user", "content": "hello there"}],
        "max_output_tokens": 100,
        "stream": stream,
        "store": false,
    })
}

#[tokio::test]
async fn responses_stream_text_then_calls_and_completes_with_usage() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(text(&["Hel", "lo"]));
    p.push(Reply::ToolCalls {
        text: Some("Let me look.".into()),
        calls: calls(),
        fragment: 5,
    });
    let resp = post(
        p.addr(),
        RESPONSES,
        &responses_body(true),
        &[("Authorization", "Bearer sk-test")],
    )
    .await;
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = resp.events();
    let kinds: Vec<&str> = events.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events
        .iter()
        .map(|(_, data)| data["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..10).collect::<Vec<u64>>());
    let done = &events[9].1["response"];
    assert_eq!(done["status"], "completed");
    // "be brief" + "hello there" = 19 chars -> 4; "Hello" = 5 chars -> 1.
    assert_eq!(done["usage"]["input_tokens"], 4);
    assert_eq!(done["usage"]["output_tokens"], 1);
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");

    let resp = post(p.addr(), RESPONSES, &responses_body(true), &[]).await;
    let events = resp.events();
    let mut arguments: Vec<(String, String)> = Vec::new();
    for (kind, data) in &events {
        match kind.as_str() {
            "response.output_item.added" if data["item"]["type"] == "function_call" => {
                arguments.push((
                    data["item"]["call_id"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            "response.function_call_arguments.delta" => {
                arguments
                    .last_mut()
                    .unwrap()
                    .1
                    .push_str(data["delta"].as_str().unwrap());
            }
            "response.output_item.done" if data["item"]["type"] == "function_call" => {
                let (call_id, streamed) = arguments.last().unwrap();
                assert_eq!(data["item"]["call_id"], json!(call_id));
                assert_eq!(data["item"]["arguments"], json!(streamed));
            }
            _ => {}
        }
    }
    let want: Vec<_> = calls().into_iter().map(|c| (c.id, c.arguments)).collect();
    assert_eq!(arguments, want);
    assert_eq!(events.last().unwrap().0, "response.completed");

    let reqs = p.requests();
    assert_eq!(reqs[0].wire, Wire::OpenAiResponses);
    assert_eq!(reqs[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert!(p.violations().is_empty());
}

#[tokio::test]
async fn responses_length_cut_and_error_endings() {
    let p = ScriptedProvider::start().await.unwrap();
    p.push(Reply::TruncatedToolCall {
        calls: calls(),
        fragment: 4,
    });
    p.push(Reply::Cut {
        deltas: vec!["Hal".into()],
        delay: Duration::ZERO,
    });
    p.push(Reply::StreamError {
        deltas: vec!["Hal".into()],
        delay: Duration::ZERO,
    });
    let events = post(p.addr(), RESPONSES, &responses_body(true), &[])
        .await
        .events();
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    // The cut call has no `done` events; the one before it has.
    let done = events
        .iter()
        .filter(|(kind, _)| kind == "response.function_call_arguments.done")
        .count();
    assert_eq!(done, 1);

    let events = post(p.addr(), RESPONSES, &responses_body(true), &[])
        .await
        .events();
    assert_eq!(events.last().unwrap().0, "response.output_text.delta");

    let events = post(p.addr(), RESPONSES, &responses_body(true), &[])
        .await
        .events();
    let (kind, error) = events.last().unwrap();
    assert_eq!(kind, "error");
    assert_eq!(error["code"], "server_error");
}

#[tokio::test]
async fn responses_history_and_demo_read_the_input_items() {
    let p = ScriptedProvider::start().await.unwrap();
    let mut body = responses_body(false);
    body["input"] = json!([
        {"type": "message", "role": "user", "content": "run `ls`"},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    ]);
    let resp = post(p.addr(), RESPONSES, &body, &[]).await;
    assert_eq!(resp.status, 200);
    let answer = resp.json();
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["output"][0]["type"], "message");
    let said = answer["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(said.contains("a.txt"), "{said}");
    let violations = p.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("c2"), "{violations:?}");

    p.push(Reply::Status {
        status: 429,
        retry_after: Some(3),
    });
    let resp = post(p.addr(), RESPONSES, &responses_body(true), &[]).await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("3"));
    assert_eq!(resp.json()["error"]["code"], "rate_limit_exceeded");
}

fn reasoning() -> Reply {
    Reply::Reasoning {
        reasoning: vec!["Grüße ".into(), "zählen.".into()],
        deltas: vec!["Hal".into(), "lo".into()],
        delay: Duration::from_millis(1),
    }
}

#[tokio::test]
async fn reasoning_is_each_wires_reasoning_never_its_text() {
    let p = ScriptedProvider::start().await.unwrap();
    for _ in 0..6 {
        p.push(reasoning());
    }

    let cs = chunks(&post(p.addr(), OPENAI, &openai_body(true, true), &[]).await);
    let field = |name: &str| -> String {
        cs.iter()
            .filter_map(|c| c["choices"][0]["delta"][name].as_str())
            .collect()
    };
    assert_eq!(field("reasoning_content"), "Grüße zählen.");
    assert_eq!(field("content"), "Hallo");
    // "Grüße zählen." + "Hallo" = 18 chars -> 4 output tokens.
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 4);
    let whole = post(p.addr(), OPENAI, &openai_body(false, false), &[])
        .await
        .json();
    assert_eq!(
        whole["choices"][0]["message"]["reasoning_content"],
        "Grüße zählen."
    );
    assert_eq!(whole["choices"][0]["message"]["content"], "Hallo");

    let events = post(p.addr(), ANTHROPIC, &anthropic_body(true), &[])
        .await
        .events();
    let blocks: Vec<(u64, &str)> = events
        .iter()
        .filter(|(kind, _)| kind == "content_block_start")
        .map(|(_, d)| {
            let kind = d["content_block"]["type"].as_str().unwrap();
            (d["index"].as_u64().unwrap(), kind)
        })
        .collect();
    assert_eq!(blocks, [(0, "thinking"), (1, "text")]);
    let deltas = |kind: &str, field: &str| -> String {
        events
            .iter()
            .filter(|(_, d)| d["delta"]["type"] == kind)
            .map(|(_, d)| d["delta"][field].as_str().unwrap())
            .collect()
    };
    assert_eq!(deltas("thinking_delta", "thinking"), "Grüße zählen.");
    assert!(!deltas("signature_delta", "signature").is_empty());
    assert_eq!(deltas("text_delta", "text"), "Hallo");
    let whole = post(p.addr(), ANTHROPIC, &anthropic_body(false), &[])
        .await
        .json();
    assert_eq!(whole["content"][0]["type"], "thinking");
    assert_eq!(
        whole["content"][1],
        json!({"type": "text", "text": "Hallo"})
    );

    let events = post(p.addr(), RESPONSES, &responses_body(true), &[])
        .await
        .events();
    let text_of = |kind: &str| -> String {
        events
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, d)| d["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        text_of("response.reasoning_summary_text.delta"),
        "Grüße zählen."
    );
    assert_eq!(text_of("response.output_text.delta"), "Hallo");
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert_eq!(done["output"][1]["output_index"], Value::Null);
    assert_eq!(done["output"][1]["content"][0]["text"], "Hallo");
    let message_events: Vec<u64> = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, d)| d["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(message_events, [1, 1]);
    let whole = post(p.addr(), RESPONSES, &responses_body(false), &[])
        .await
        .json();
    assert_eq!(whole["output"][0]["summary"][0]["text"], "Grüße zählen.");
}
