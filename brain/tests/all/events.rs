//! The chat events stream (SPEC S2): observers on another replica than the turn's,
//! `Last-Event-ID` replay, trimming, keep-alives, slow observers, isolation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use crate::common::replies::deltas;
use crate::common::{TestApp, read_stream};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use protocol::ui::{FinishReason, Notice, UiChunk};
use scripted_provider::Reply;
use serde_json::json;

/// One SSE event of the events stream.
#[derive(Debug)]
enum Sse {
    Chunk { id: Option<String>, chunk: UiChunk },
    KeepAlive,
}

/// An open events stream, read event by event.
struct Observer {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
}

impl Observer {
    async fn open(app: &TestApp, base: &str, chat: &str, last: Option<&str>) -> Self {
        let mut request = app.auth(app.http.get(format!("{base}/v1/chats/{chat}/events")));
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "an SSE stream"
        );
        Self::from(response)
    }

    fn from(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next event, `None` when the stream ended; panics after `within`.
    async fn next(&mut self, within: Duration) -> Option<Sse> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                return Some(parse(raw.trim_end()));
            }
            match tokio::time::timeout_at(deadline, self.body.next())
                .await
                .expect("no event in time")
            {
                Some(piece) => self
                    .buffer
                    .push_str(std::str::from_utf8(&piece.unwrap()).unwrap()),
                None => return None,
            }
        }
    }

    /// The next chunk event, skipping keep-alives.
    async fn chunk(&mut self) -> (Option<String>, UiChunk) {
        loop {
            match self.next(Duration::from_secs(10)).await {
                Some(Sse::Chunk { id, chunk }) => return (id, chunk),
                Some(Sse::KeepAlive) => {}
                None => panic!("the events stream ended"),
            }
        }
    }

    /// Chunks (with their ids) up to and including the next `finish`.
    async fn until_finish(&mut self) -> Vec<(Option<String>, UiChunk)> {
        let mut seen = Vec::new();
        loop {
            let event = self.chunk().await;
            let finished = matches!(event.1, UiChunk::Finish { .. });
            seen.push(event);
            if finished {
                return seen;
            }
        }
    }
}

fn parse(raw: &str) -> Sse {
    if raw == ": keep-alive" {
        return Sse::KeepAlive;
    }
    let mut id = None;
    let mut data = None;
    for line in raw.lines() {
        if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = Some(v.to_owned());
        } else {
            panic!("unexpected SSE line {line:?}");
        }
    }
    let data = data.unwrap_or_else(|| panic!("an event without data: {raw:?}"));
    Sse::Chunk {
        id,
        chunk: serde_json::from_str(&data).unwrap_or_else(|e| panic!("bad chunk {data}: {e}")),
    }
}

/// Runs one turn on `app` and returns what its client received.
async fn turn(app: &TestApp, chat: &str, reply: Reply) -> Vec<UiChunk> {
    app.provider.push(reply);
    let response = app.send(chat, &json!({"content": "go"})).await;
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    chunks
}

fn turn_of(chunks: &[UiChunk]) -> UiChunk {
    chunks
        .iter()
        .find(|c| matches!(c, UiChunk::DataTurn { .. }))
        .cloned()
        .expect("the turn's stream names it")
}

/// An SSE id as (ms, seq, part): `<ms>-<seq>` is part 0 of its entry, `<ms>-<seq>.<n>` part n.
fn parsed_id(id: &str) -> (u64, u64, u32) {
    let (entry, part) = id.split_once('.').unwrap_or((id, "0"));
    let (ms, seq) = entry.split_once('-').unwrap();
    (
        ms.parse().unwrap(),
        seq.parse().unwrap(),
        part.parse().unwrap(),
    )
}

fn ids_increase(events: &[(Option<String>, UiChunk)]) {
    let ids: Vec<(u64, u64, u32)> = events
        .iter()
        .filter_map(|(id, _)| id.as_deref())
        .map(parsed_id)
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
}

/// What an observer sees of a turn whose client got `chunks`: the `data-turn` part, then
/// every chunk in order.
fn observed(chunks: &[UiChunk]) -> Vec<UiChunk> {
    std::iter::once(turn_of(chunks))
        .chain(chunks.iter().cloned())
        .collect()
}

#[tokio::test]
async fn an_observer_on_another_replica_sees_every_chunk_of_a_turn_in_order() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let mut observer = Observer::open(&app, &replica_b, &chat, None).await;

    let chunks = turn(&app, &chat, deltas(&["Hello", ", ", "world."])).await;
    let seen = observer.until_finish().await;
    ids_increase(&seen);
    assert!(
        seen[0].0.is_none(),
        "the data-turn part has no id of its own"
    );
    assert!(seen[1..].iter().all(|(id, _)| id.is_some()));
    let seen: Vec<UiChunk> = seen.into_iter().map(|(_, c)| c).collect();
    assert_eq!(seen, observed(&chunks));
    assert_eq!(
        seen.last(),
        Some(&UiChunk::Finish {
            finish_reason: FinishReason::Stop
        })
    );
}

#[tokio::test]
async fn a_reconnect_gets_exactly_the_missed_events_then_live() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let mut first = Observer::open(&app, &replica_b, &chat, None).await;
    let one = turn(&app, &chat, deltas(&["a", "b", "c", "d"])).await;
    // The observer reads the data-turn part and three chunks, then goes away.
    let mut last = None;
    for _ in 0..4 {
        let (id, _) = first.chunk().await;
        last = id.or(last);
    }
    drop(first);
    let two = turn(&app, &chat, deltas(&["e", "f"])).await;

    // On the turn's replica this time, through the query parameter.
    let response = app
        .auth(app.http.get(format!(
            "{}/v1/chats/{chat}/events?last_event_id={}",
            app.url,
            last.unwrap()
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut again = Observer::from(response);
    let mut replayed = again.until_finish().await;
    replayed.extend(again.until_finish().await);
    let three = turn(&app, &chat, deltas(&["g"])).await;
    replayed.extend(again.until_finish().await);
    ids_increase(&replayed);

    let mut expected = vec![turn_of(&one)];
    expected.extend(one[3..].iter().cloned());
    expected.extend(observed(&two));
    expected.extend(observed(&three));
    let replayed: Vec<UiChunk> = replayed.into_iter().map(|(_, c)| c).collect();
    assert_eq!(replayed, expected, "no gap, no duplicate");
}

/// A connection of the test's own to the Redis the app uses.
async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap()
}

/// The publisher trims a chat's stream and pushes back its expiry once per tenth of the
/// window, not in every batch: a chunk written between two of those must still outlive
/// the window (an expiry of the bare window, set before that chunk, would not).
#[tokio::test]
async fn a_stream_outlives_the_window_after_its_last_chunk() {
    let window = Duration::from_secs(10);
    let app = TestApp::start_with(|c| c.events.window = window).await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    turn(&app, &chat, deltas(&["one"])).await;
    turn(&app, &chat, deltas(&["two"])).await;
    // The second turn's chunks were handed to the publisher before its stream ended.
    let last_write_at_most = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut redis = redis().await;
    let key = engine::events::stream_key(chat.parse().unwrap());
    let len: u64 = redis::cmd("XLEN")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(len > 0, "both turns' chunks are in the stream");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    let since = last_write_at_most.elapsed().as_millis() as i64;
    assert!(
        pttl + since >= window.as_millis() as i64,
        "the stream lives at least the window after its last chunk: {pttl} ms left, {since} ms after"
    );
    assert!(
        pttl <= (window + window / 10).as_millis() as i64,
        "and not beyond the window and its tenth: {pttl} ms"
    );
}

/// A turn's chunks of one publisher write go to the stream as one entry, its
/// parts; a client that had only some parts of an entry resumes inside it, with no gap and
/// no duplicate.
#[tokio::test]
async fn a_turns_chunks_share_entries_and_a_reconnect_resumes_inside_one() {
    // Long enough that the whole turn is gathered in one or two writes, however loaded.
    let app = TestApp::start_with(|c| c.events.flush = Duration::from_millis(500)).await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let mut first = Observer::open(&app, &app.url, &chat, None).await;
    let chunks = turn(&app, &chat, deltas(&["a", "b", "c", "d", "e"])).await;
    let seen = first.until_finish().await;
    drop(first);
    ids_increase(&seen);

    let mut redis = redis().await;
    let entries: usize = redis::cmd("XLEN")
        .arg(engine::events::stream_key(chat.parse().unwrap()))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        entries < chunks.len(),
        "{} chunks in {entries} entries",
        chunks.len()
    );
    // The last chunk given of the first entry that holds more than one.
    let ids: Vec<(usize, (u64, u64, u32))> = seen
        .iter()
        .enumerate()
        .filter_map(|(n, (id, _))| id.as_deref().map(|id| (n, parsed_id(id))))
        .collect();
    let (cut, _) = ids
        .iter()
        .find(|(_, (_, _, part))| *part == 1)
        .expect("an entry with a second part");
    let last = seen[*cut].0.clone().unwrap();
    assert!(last.contains('.'), "{last}");

    let mut again = Observer::open(&app, &app.url, &chat, Some(&last)).await;
    let resumed = again.until_finish().await;
    ids_increase(&resumed);
    // Named again before the first chunk given, as at any start.
    let expected: Vec<UiChunk> = std::iter::once(turn_of(&chunks))
        .chain(seen[cut + 1..].iter().map(|(_, c)| c.clone()))
        .collect();
    let resumed: Vec<UiChunk> = resumed.into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        resumed, expected,
        "the rest of the entry, then the next ones"
    );
    assert_eq!(resumed.last(), chunks.last());
}

#[tokio::test]
async fn an_id_that_fell_out_of_the_window_gets_a_resync() {
    // One chunk a write (the reply's deltas come a millisecond apart), so the 400 chunks
    // are hundreds of entries and Redis' node-wise trim removes the first ones.
    let app = TestApp::start_with(|c| {
        c.events.max_len = 10;
        c.events.flush = Duration::ZERO;
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let mut first = Observer::open(&app, &app.url, &chat, None).await;
    let many: Vec<String> = (0..400).map(|i| format!("{i} ")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    turn(&app, &chat, deltas(&many)).await;
    first.chunk().await;
    let (oldest, _) = first.chunk().await;
    drop(first);

    let mut redis = redis().await;
    let len: u64 = redis::cmd("XLEN")
        .arg(engine::events::stream_key(chat.parse().unwrap()))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        len < 300,
        "the stream was trimmed to about its bound: {len}"
    );

    let mut again = Observer::open(&app, &app.url, &chat, oldest.as_deref()).await;
    let (id, chunk) = again.chunk().await;
    assert!(id.is_none());
    assert!(
        matches!(&chunk, UiChunk::DataResync { data, transient: true } if data.reason == "trimmed"),
        "{chunk:?}"
    );
    // Then live, and only live.
    let next = turn(&app, &chat, deltas(&["fresh"])).await;
    let seen: Vec<UiChunk> = again
        .until_finish()
        .await
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(seen, observed(&next));
}

#[tokio::test]
async fn an_idle_stream_gets_keep_alives() {
    let app = TestApp::start_with(|c| c.events.keepalive = Duration::from_millis(100)).await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let mut observer = Observer::open(&app, &app.url, &chat, None).await;
    let started = Instant::now();
    for _ in 0..3 {
        assert!(matches!(
            observer.next(Duration::from_secs(2)).await,
            Some(Sse::KeepAlive)
        ));
    }
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_stalled_observer_is_disconnected_and_never_slows_the_turn() {
    let app = TestApp::start_with(|c| c.events.observer_buffer = 4).await;
    let (replica_b, _) = app
        .second_replica_with(|c| c.events.observer_buffer = 512)
        .await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    // Opened, then never read while the turn streams far more than socket buffers hold.
    let mut stalled = Observer::open(&app, &app.url, &chat, None).await;
    let mut fine = Observer::open(&app, &replica_b, &chat, None).await;
    let fine = tokio::spawn(async move { fine.until_finish().await.len() });
    let big = "x".repeat(4000);
    let deltas: Vec<&str> = (0..3000).map(|_| big.as_str()).collect();
    let reply = Reply::Text {
        deltas: deltas.iter().map(|d| (*d).to_owned()).collect(),
        delay: Duration::ZERO,
    };
    // A turn that waited for the stalled observer would never end: the bound tells a
    // hang from a slow machine (it is no measure of speed; 12 MB take 15-30 s when the
    // machine is loaded).
    let chunks = tokio::time::timeout(Duration::from_secs(120), turn(&app, &chat, reply))
        .await
        .expect("the turn ended although an observer stopped reading");
    assert!(matches!(chunks.last(), Some(UiChunk::Finish { .. })));
    // A reading observer on the other replica kept up (it sees the same chunks).
    let seen = tokio::time::timeout(Duration::from_secs(30), fine)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen, chunks.len() + 1);

    // The stalled one, once it reads, finds the reason, then the end.
    let mut last = None;
    while let Some(event) = stalled.next(Duration::from_secs(30)).await {
        last = Some(event);
    }
    match last {
        Some(Sse::Chunk {
            id: None,
            chunk: UiChunk::DataNotice {
                data: Notice { code, .. },
            },
        }) => assert_eq!(code, "observer_too_slow"),
        other => panic!("the stream should end with the reason, got {other:?}"),
    }
    assert!(
        app.metrics()
            .await
            .contains("brain_event_observers_too_slow_total 1")
    );
    app.settled().await;
}

#[tokio::test]
async fn other_teams_unknown_chats_and_bad_ids_are_refused() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let other = app.store.create_team("other team").await.unwrap();
    let get = |key: String, path: String, last: Option<&'static str>| {
        let mut request = app.http.get(format!("{}{path}", app.url)).bearer_auth(key);
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last);
        }
        request.send()
    };
    let response = get(
        other.api_key.clone(),
        format!("/v1/chats/{chat}/events"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 404);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    let unknown = uuid::Uuid::now_v7();
    let response = get(app.key.clone(), format!("/v1/chats/{unknown}/events"), None)
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let response = get(
        app.key.clone(),
        format!("/v1/chats/{chat}/events"),
        Some("yesterday"),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request");
}

#[tokio::test]
async fn without_redis_the_endpoint_answers_503_and_turns_still_run() {
    let app = TestApp::start().await;
    let (dead_redis, _) = app
        .second_replica_with(|c| c.redis_url = "redis://127.0.0.1:1".into())
        .await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let response = app
        .auth(app.http.get(format!("{dead_redis}/v1/chats/{chat}/events")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "events_unavailable");

    // A turn on that replica streams to its client; its chunks are dropped and counted.
    app.provider.push(deltas(&["still ", "here"]));
    let response = app
        .auth(
            app.http
                .post(format!("{dead_redis}/v1/chats/{chat}/messages")),
        )
        .json(&json!({"content": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (chunks, done) = read_stream(response).await;
    assert!(done);
    assert_eq!(common::streamed_text(&chunks), "still here");
}

/// `GET /v1/chats/{id}/stream` (the AI SDK's `resume`): on another replica than the
/// turn's, a turn joined halfway comes whole from its `start`, exactly as its own client got
/// it, then `[DONE]`; with no turn running there is nothing to resume.
#[tokio::test]
async fn a_running_turn_is_resumed_from_its_start_on_another_replica() {
    let app = TestApp::start().await;
    let replica_b = app.second_replica().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let resume = || {
        app.auth(app.http.get(format!("{replica_b}/v1/chats/{chat}/stream")))
            .send()
    };
    assert_eq!(resume().await.unwrap().status(), 204, "no turn runs yet");

    app.provider.push(Reply::Text {
        deltas: (0..8).map(|i| format!("part{i} ")).collect(),
        delay: Duration::from_millis(150),
    });
    let own = app.send(&chat, &json!({"content": "go"})).await;
    assert_eq!(own.status(), 200);
    // Some chunks are out before the resume opens: the turn's own client has its first
    // part (and seven are still to come).
    let mut own = own.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("part0") {
        let piece = own.next().await.expect("the turn's stream ended early");
        seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    let own = tokio::spawn(async move {
        while let Some(piece) = own.next().await {
            seen.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
        }
        common::parse_events(&seen)
    });
    let resumed = resume().await.unwrap();
    assert_eq!(resumed.status(), 200);
    assert_eq!(resumed.headers()["content-type"], "text/event-stream");
    assert_eq!(resumed.headers()["x-vercel-ai-ui-message-stream"], "v1");
    let (resumed, done) = read_stream(resumed).await;
    let (own, own_done) = own.await.unwrap();
    assert!(done && own_done, "both end with [DONE]");
    assert_eq!(resumed, own, "the resumed stream is the turn's own");
    assert!(matches!(resumed.first(), Some(UiChunk::Start { .. })));
    assert_eq!(resume().await.unwrap().status(), 204, "the turn ended");

    let other = app.store.create_team("other team").await.unwrap();
    let response = app
        .http
        .get(format!("{replica_b}/v1/chats/{chat}/stream"))
        .bearer_auth(other.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// A Redis server of the test's own, so that the brains' connections to it can be counted
/// without other tests' in the list; stopped when dropped.
struct PrivateRedis {
    url: String,
    server: std::process::Child,
}

impl PrivateRedis {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        // Owned at once, so that the server is stopped on every path, a failed start too.
        let redis = Self {
            url: format!("redis://127.0.0.1:{port}"),
            server,
        };
        let client = redis::Client::open(redis.url.as_str()).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not start");
    }

    /// Connections to this server but the one asking.
    async fn clients(&self) -> usize {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .unwrap();
        list.lines().count() - 1
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Chats of a new agent: their ids.
async fn chats(app: &TestApp, n: usize) -> Vec<String> {
    let (agent, first) = app.agent_and_chat("openai/test", &[]).await;
    let mut chats = vec![first];
    while chats.len() < n {
        chats.push(app.new_chat(&agent).await);
    }
    chats
}

/// Observers of 60 chats on one replica share its Redis connections: a handful at most,
/// not one per chat; and every observer still gets every chunk of its own chat.
#[tokio::test]
async fn sixty_observed_chats_add_a_handful_of_redis_connections() {
    let redis = PrivateRedis::start().await;
    let url = redis.url.clone();
    let app = TestApp::start_with(|c| c.redis_url = url).await;
    let replica_b = app.second_replica().await;
    let chats = chats(&app, 60).await;
    let mut observers = vec![Observer::open(&app, &replica_b, &chats[0], None).await];
    let before = redis.clients().await;
    for chat in &chats[1..] {
        observers.push(Observer::open(&app, &replica_b, chat, None).await);
    }
    // A second observer of one chat.
    let mut again = Observer::open(&app, &replica_b, &chats[30], None).await;
    let after = redis.clients().await;
    assert!(
        after <= before + 2,
        "60 observed chats took {} Redis connections",
        after - before
    );

    for n in [0, 30, 59] {
        let chunks = turn(&app, &chats[n], deltas(&["one ", "of ", "sixty"])).await;
        let seen: Vec<UiChunk> = observers[n]
            .until_finish()
            .await
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(seen, observed(&chunks), "chat {n}");
        if n == 30 {
            let seen: Vec<UiChunk> = again
                .until_finish()
                .await
                .into_iter()
                .map(|(_, c)| c)
                .collect();
            assert_eq!(seen, observed(&chunks), "the second observer of chat 30");
        }
    }
    // Chat 1's observer got nothing of those turns: its first turn is its own.
    let chunks = turn(&app, &chats[1], deltas(&["mine"])).await;
    let seen: Vec<UiChunk> = observers[1]
        .until_finish()
        .await
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(seen, observed(&chunks));
}

/// Observers are capped per principal and per replica: past either cap, `429
/// too_many_observers` with `Retry-After`; a closed stream frees its place.
#[tokio::test]
async fn observers_past_their_caps_are_refused_with_429() {
    let app = TestApp::start_with(|c| {
        c.events.max_observers_per_principal = 2;
        c.events.max_observers = 3;
    })
    .await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    let other = app
        .post_json("/v1/keys", &json!({"name": "other", "scope": "chat"}))
        .await;
    assert_eq!(other.status(), 201);
    let other: serde_json::Value = other.json().await.unwrap();
    let other = other["api_key"].as_str().unwrap().to_owned();
    let open = |key: String| {
        app.http
            .get(format!("{}/v1/chats/{chat}/events", app.url))
            .bearer_auth(key)
            .send()
    };
    let refused = |response: reqwest::Response| async move {
        assert_eq!(response.status(), 429);
        let after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(after >= 1);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "too_many_observers");
    };
    let first = open(app.key.clone()).await.unwrap();
    assert_eq!(first.status(), 200);
    let second = open(app.key.clone()).await.unwrap();
    assert_eq!(second.status(), 200);
    refused(open(app.key.clone()).await.unwrap()).await;
    // Another principal has places of its own, up to the replica's.
    let third = open(other.clone()).await.unwrap();
    assert_eq!(third.status(), 200);
    refused(open(other.clone()).await.unwrap()).await;

    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = open(other.clone()).await.unwrap();
        if response.status() == 200 {
            break;
        }
        refused(response).await;
        assert!(
            Instant::now() < deadline,
            "a closed stream never freed its place"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((second, third));
}

/// A resumed turn stream that meets a gap in its turn's chunks (a batch the publisher could
/// not write, marked by a `resync` entry) cannot build the rest of the message: it says so
/// with an `error` part and `[DONE]` instead of stopping mid-answer.
#[tokio::test]
async fn a_resumed_turn_stream_that_meets_a_gap_ends_with_an_error_part() {
    let app = TestApp::start().await;
    let (_, chat) = app.agent_and_chat("openai/test", &[]).await;
    app.provider.push(Reply::Text {
        deltas: vec!["tick ".into(); 200],
        delay: Duration::from_millis(50),
    });
    let running = app.send(&chat, &json!({"content": "go"})).await;
    assert_eq!(running.status(), 200);
    let mut resumed = app
        .auth(app.http.get(format!("{}/v1/chats/{chat}/stream", app.url)))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut body = String::new();
    while !body.contains("tick") {
        let piece = resumed.chunk().await.unwrap().expect("the turn streams");
        body.push_str(std::str::from_utf8(&piece).unwrap());
    }

    // The marker the publisher writes after a batch it could not write.
    let _: String = redis::cmd("XADD")
        .arg(engine::events::stream_key(chat.parse().unwrap()))
        .arg("*")
        .arg("r")
        .arg("dropped")
        .query_async(&mut redis().await)
        .await
        .unwrap();
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(piece) = resumed.chunk().await.unwrap() {
            body.push_str(std::str::from_utf8(&piece).unwrap());
        }
        body
    })
    .await
    .expect("the resumed stream ends at the gap, before the turn does");
    let (chunks, done) = common::parse_events(&rest);
    assert!(done, "{chunks:?}");
    assert!(
        matches!(chunks.last(), Some(UiChunk::Error { error_text }) if error_text.starts_with("events_unavailable: ")),
        "{:?}",
        chunks.last()
    );
    drop(running);
}
