//! What every adapter shares: sending the request under the connect timeout, classifying a
//! refusal, and driving a wire decoder over the SSE body under the idle timeout.
//!
//! The adapters only know their wire format; everything that decides *when* a stream ends
//! or fails lives here, so they cannot drift apart on the stream contract.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, RETRY_AFTER};

use super::reasoning::InlineReasoning;
use super::{EventStream, ProviderError, ProviderEvent, Unavailable};

/// One wire format, decoded one SSE event at a time.
///
/// A state machine rather than a stream combinator so it can be driven from byte fixtures
/// and grow tool-call assembly without touching the transport.
pub(super) trait Decoder: Send + 'static {
    /// The events one SSE event carries, in order. Anything after a
    /// [`ProviderEvent::Finished`] is dropped; an error ends the stream.
    fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError>;
}

/// Sends the request and waits for the status, at most `connect_timeout`.
pub(super) async fn send(
    provider: &'static str,
    request: reqwest::RequestBuilder,
    connect_timeout: Duration,
) -> Result<reqwest::Response, ProviderError> {
    let started = Instant::now();
    let outcome = match tokio::time::timeout(connect_timeout, request.send()).await {
        Err(_elapsed) => Err(ProviderError::Unavailable(Unavailable::Timeout)),
        Ok(Err(err)) => Err(ProviderError::from_transport(&err)),
        Ok(Ok(response)) if response.status().is_success() => Ok(response),
        // The error body is left unread: it may echo the prompt, and nothing we do depends
        // on it.
        Ok(Ok(response)) => Err(ProviderError::from_status(
            response.status().as_u16(),
            retry_after(response.headers()),
        )),
    };
    let elapsed_ms = millis(started.elapsed());
    match &outcome {
        Ok(response) => tracing::debug!(
            provider,
            status = response.status().as_u16(),
            elapsed_ms,
            "provider accepted the request"
        ),
        Err(err) => tracing::warn!(
            provider,
            class = err.metric_label(),
            error = %err,
            elapsed_ms,
            "provider call failed before streaming"
        ),
    }
    outcome
}

/// `Retry-After` in seconds. The HTTP-date form is ignored: providers send seconds, and a
/// wrong clock would turn a date into nonsense.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => value
            .parse::<f64>()
            .ok()
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok()),
    }
}

/// Turns a response body into the provider-neutral stream (see the contract in `mod.rs`).
pub(super) fn decode<S, D>(
    provider: &'static str,
    body: S,
    decoder: D,
    idle_timeout: Duration,
) -> EventStream
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
    D: Decoder,
{
    let driver = Driver {
        provider,
        sse: Some(Box::pin(
            with_idle_timeout(body, idle_timeout).eventsource(),
        )),
        decoder,
        inline: InlineReasoning::default(),
        pending: VecDeque::new(),
        started: Instant::now(),
    };
    Box::pin(futures_util::stream::unfold(
        driver,
        |mut driver| async move {
            let item = driver.next().await?;
            Some((item, driver))
        },
    ))
}

enum BodyError {
    Transport(reqwest::Error),
    Idle,
}

/// The idle timeout is applied to raw body chunks, not to SSE events, so keep-alive
/// comments (OpenRouter sends `: OPENROUTER PROCESSING` while the upstream thinks) count
/// as signs of life.
fn with_idle_timeout<S>(
    body: S,
    idle_timeout: Duration,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Send
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
{
    futures_util::stream::unfold(Box::pin(body), move |mut body| async move {
        match tokio::time::timeout(idle_timeout, body.next()).await {
            Ok(Some(chunk)) => Some((chunk.map_err(BodyError::Transport), body)),
            Ok(None) => None,
            // The driver stops at the first error, so this is never polled again.
            Err(_elapsed) => Some((Err(BodyError::Idle), body)),
        }
    })
}

type SseStream = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<BodyError>>> + Send>>;

struct Driver<D> {
    provider: &'static str,
    /// `None` once the stream ended: dropping it releases the connection right away
    /// instead of when the consumer drops us.
    sse: Option<SseStream>,
    decoder: D,
    /// Applied to every decoder's output, so no adapter can forget it.
    inline: InlineReasoning,
    pending: VecDeque<ProviderEvent>,
    started: Instant,
}

impl<D: Decoder> Driver<D> {
    async fn next(&mut self) -> Option<Result<ProviderEvent, ProviderError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                if let ProviderEvent::Finished(reason) = &event {
                    tracing::debug!(
                        provider = self.provider,
                        stop_reason = ?reason,
                        elapsed_ms = millis(self.started.elapsed()),
                        "provider stream finished"
                    );
                    self.end();
                }
                return Some(Ok(event));
            }
            let sse = self.sse.as_mut()?;
            let outcome = match sse.next().await {
                None => Err(ProviderError::Unavailable(Unavailable::Incomplete)),
                Some(Err(err)) => Err(classify(err)),
                Some(Ok(event)) => self.decoder.feed(&event),
            };
            match outcome {
                Ok(events) => {
                    let mut split = Vec::with_capacity(events.len());
                    for event in events {
                        self.inline.feed(event, &mut split);
                    }
                    self.pending.extend(split);
                }
                Err(err) => {
                    tracing::warn!(
                        provider = self.provider,
                        class = err.metric_label(),
                        elapsed_ms = millis(self.started.elapsed()),
                        "provider stream failed"
                    );
                    self.end();
                    return Some(Err(err));
                }
            }
        }
    }

    fn end(&mut self) {
        self.sse = None;
        self.pending.clear();
    }
}

fn classify(err: EventStreamError<BodyError>) -> ProviderError {
    match err {
        EventStreamError::Transport(BodyError::Idle) => {
            ProviderError::Unavailable(Unavailable::Timeout)
        }
        EventStreamError::Transport(BodyError::Transport(err)) => {
            ProviderError::from_transport(&err)
        }
        EventStreamError::Utf8(_) | EventStreamError::Parser(_) => {
            ProviderError::Unavailable(Unavailable::Decode)
        }
    }
}

/// Maps a JSON parse failure of one event's data; the serde message is dropped because it
/// may quote the model's text.
pub(super) fn undecodable<E>(_: E) -> ProviderError {
    ProviderError::Unavailable(Unavailable::Decode)
}

fn millis(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// Fixture and loopback helpers shared by the adapters' tests.
#[cfg(test)]
pub(super) mod testing {
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::{Decoder, decode};
    use crate::{ProviderError, ProviderEvent};

    pub type Items = Vec<Result<ProviderEvent, ProviderError>>;

    const LONG: Duration = Duration::from_secs(3600);

    /// Runs `chunks` through the same driver the HTTP path uses.
    pub async fn run<D: Decoder + Default>(chunks: Vec<Vec<u8>>) -> Items {
        let body = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|chunk| Ok::<_, reqwest::Error>(Bytes::from(chunk))),
        );
        decode("test", body, D::default(), LONG).collect().await
    }

    /// Decodes `body` whole, one byte per chunk (which splits every UTF-8 character and
    /// every CRLF) and cut in two at every offset; all must agree.
    pub async fn decode_all_ways<D: Decoder + Default>(body: &[u8]) -> Items {
        let whole = run::<D>(vec![body.to_vec()]).await;
        let bytewise = run::<D>(body.iter().map(|byte| vec![*byte]).collect()).await;
        assert_eq!(bytewise, whole, "byte by byte");
        for cut in 0..=body.len() {
            let (head, tail) = body.split_at(cut);
            let halves = run::<D>(vec![head.to_vec(), tail.to_vec()]).await;
            assert_eq!(halves, whole, "cut at byte {cut}");
        }
        whole
    }

    /// The text deltas, joined.
    pub fn text(items: &Items) -> String {
        items
            .iter()
            .filter_map(|item| match item {
                Ok(ProviderEvent::TextDelta(text)) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Everything but the text deltas, in order.
    pub fn non_text(items: Items) -> Items {
        items
            .into_iter()
            .filter(|item| !matches!(item, Ok(ProviderEvent::TextDelta(_))))
            .collect()
    }

    /// A request as the loopback server received it.
    #[derive(Debug)]
    pub struct Received {
        pub request_line: String,
        /// Names lowercased.
        pub headers: Vec<(String, String)>,
        pub body: serde_json::Value,
    }

    impl Received {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        }
    }

    /// A one-connection HTTP/1.1 server on 127.0.0.1: reads one request, writes `head`,
    /// then each of `body_chunks` with `pause` between them, then waits `linger` before
    /// closing (the body is close-delimited). Returns the base URL and the request.
    pub async fn serve_once(
        head: &str,
        body_chunks: Vec<Vec<u8>>,
        pause: Duration,
        linger: Duration,
    ) -> (String, tokio::task::JoinHandle<Received>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let head = head.to_owned();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let received = read_request(&mut socket).await;
            socket.write_all(head.as_bytes()).await.unwrap();
            for chunk in body_chunks {
                socket.write_all(&chunk).await.unwrap();
                socket.flush().await.unwrap();
                tokio::time::sleep(pause).await;
            }
            tokio::time::sleep(linger).await;
            let _ = socket.shutdown().await;
            received
        });
        (base, task)
    }

    async fn read_request(socket: &mut tokio::net::TcpStream) -> Received {
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        let header_end = loop {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "client closed before sending headers");
            raw.extend_from_slice(&buf[..n]);
            if let Some(pos) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos;
            }
        };
        let head = String::from_utf8(raw[..header_end].to_vec()).unwrap();
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap().to_owned();
        let headers: Vec<(String, String)> = lines
            .map(|line| {
                let (name, value) = line.split_once(':').unwrap();
                (name.trim().to_ascii_lowercase(), value.trim().to_owned())
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .map(|(_, value)| value.parse().unwrap())
            .unwrap_or(0);
        let mut body = raw[header_end + 4..].to_vec();
        while body.len() < length {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "client closed mid-body");
            body.extend_from_slice(&buf[..n]);
        }
        Received {
            request_line,
            headers,
            body: serde_json::from_slice(&body).unwrap(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::StreamExt;
    use reqwest::header::HeaderValue;

    use super::testing::serve_once;
    use super::*;
    use crate::StopReason;

    /// Emits every event of a line `text <s>` / `finish`, so the driver can be tested
    /// apart from any real wire format.
    #[derive(Default)]
    struct LineDecoder;

    impl Decoder for LineDecoder {
        fn feed(&mut self, event: &Event) -> Result<Vec<ProviderEvent>, ProviderError> {
            match event.data.split_once(' ') {
                Some(("text", text)) => Ok(vec![ProviderEvent::TextDelta(text.to_owned())]),
                _ if event.data == "finish" => Ok(vec![
                    ProviderEvent::Finished(StopReason::Stop),
                    ProviderEvent::TextDelta("after finish".into()),
                ]),
                _ => Err(ProviderError::Unavailable(Unavailable::StreamError)),
            }
        }
    }

    fn post(base: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new().post(format!("{base}/x")).json(&1)
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static(" 7 "));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1.5"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(1500)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&headers), None);
    }

    #[tokio::test]
    async fn the_stream_ends_after_finished_and_drops_what_follows() {
        let items = testing::run::<LineDecoder>(vec![
            b"data: text a\n\ndata: finish\n\ndata: text b\n\n".to_vec(),
        ])
        .await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn the_stream_ends_after_an_error() {
        let items =
            testing::run::<LineDecoder>(vec![b"data: bad\n\ndata: text b\n\n".to_vec()]).await;
        assert_eq!(
            items,
            vec![Err(ProviderError::Unavailable(Unavailable::StreamError))]
        );
    }

    #[tokio::test]
    async fn a_body_ending_without_the_end_marker_is_incomplete() {
        // The last event lacks its blank line, so it was never whole.
        let items =
            testing::run::<LineDecoder>(vec![b"data: text a\n\ndata: finish\n".to_vec()]).await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Err(ProviderError::Unavailable(Unavailable::Incomplete)),
            ]
        );
        let empty = testing::run::<LineDecoder>(vec![]).await;
        assert_eq!(
            empty,
            vec![Err(ProviderError::Unavailable(Unavailable::Incomplete))]
        );
    }

    #[tokio::test]
    async fn invalid_utf8_is_undecodable() {
        let items = testing::run::<LineDecoder>(vec![
            b"data: text a\n\ndata: text \xff\xfe\n\n".to_vec(),
            b"data: finish\n\n".to_vec(),
        ])
        .await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Err(ProviderError::Unavailable(Unavailable::Decode)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn silence_between_chunks_times_out() {
        let body = futures_util::stream::iter([Ok::<_, reqwest::Error>(Bytes::from_static(
            b"data: text a\n\n",
        ))])
        .chain(futures_util::stream::pending());
        let items: Vec<_> = decode("test", body, LineDecoder, Duration::from_secs(5))
            .collect()
            .await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Err(ProviderError::Unavailable(Unavailable::Timeout)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_comments_reset_the_idle_timeout() {
        // Four seconds apart against a five-second limit: never silent for too long, though
        // no event arrives for twelve seconds.
        let chunks = [
            &b"data: text a\n\n"[..],
            b": keep-alive\n\n",
            b": keep-alive\n\n",
            b": keep-alive\n\n",
            b"data: finish\n\n",
        ];
        let body = futures_util::stream::iter(chunks).then(|chunk| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok::<_, reqwest::Error>(Bytes::from_static(chunk))
        });
        let items: Vec<_> = decode("test", body, LineDecoder, Duration::from_secs(5))
            .collect()
            .await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Ok(ProviderEvent::Finished(StopReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn statuses_are_classified_with_retry_after() {
        let (base, _server) = serve_once(
            "HTTP/1.1 429 Too Many Requests\r\nretry-after: 12\r\ncontent-length: 0\r\n\r\n",
            vec![],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let err = send("test", post(&base), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ProviderError::RateLimited {
                retry_after: Some(Duration::from_secs(12))
            }
        );

        let (base, _server) = serve_once(
            "HTTP/1.1 529 Overloaded\r\ncontent-length: 0\r\n\r\n",
            vec![],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let err = send("test", post(&base), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err, ProviderError::Unavailable(Unavailable::Status(529)));

        let (base, _server) = serve_once(
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}",
            vec![],
            Duration::ZERO,
            Duration::ZERO,
        )
        .await;
        let err = send("test", post(&base), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err, ProviderError::Rejected { status: 400 });
    }

    #[tokio::test]
    async fn no_status_within_the_connect_timeout_is_a_timeout() {
        let (base, _server) = serve_once("", vec![], Duration::ZERO, Duration::from_secs(30)).await;
        let started = Instant::now();
        let err = send("test", post(&base), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(err, ProviderError::Unavailable(Unavailable::Timeout));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        // Bind then drop, so the port is very likely closed.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let err = send("test", post(&base), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err, ProviderError::Unavailable(Unavailable::Connect));
    }

    #[tokio::test]
    async fn silence_mid_body_over_http_times_out() {
        let (base, _server) = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
            vec![b"data: text a\n\n".to_vec()],
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .await;
        let response = send("test", post(&base), Duration::from_secs(5))
            .await
            .unwrap();
        let items: Vec<_> = decode(
            "test",
            response.bytes_stream(),
            LineDecoder,
            Duration::from_millis(200),
        )
        .collect()
        .await;
        assert_eq!(
            items,
            vec![
                Ok(ProviderEvent::TextDelta("a".into())),
                Err(ProviderError::Unavailable(Unavailable::Timeout)),
            ]
        );
    }
}
