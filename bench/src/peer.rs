//! The peer side by side (`BENCH_ONLY=peer`, run by `make bench-peer`): the turn-overhead
//! scenario against the brain and against LangGraph's dev server in the same run, both
//! calling the same scripted provider, so that the ratio of what each adds survives a
//! noisy shared machine. The peer is a one-node graph (`bench/peer/graph.py`) making one
//! streamed `ChatOpenAI` call; the brain turn is the one `turn` measures.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::system::{
    Row, System, closed_loop, instant_ok, ms, pct, row, signed_ms, sorted, window,
};
use crate::turn::{ChatClient, TURNS_PER_CHAT, timed_provider};

/// Not LangGraph's default 2024, which is taken on these machines (shared/TOOLING.md).
const PORT: u16 = 2124;
/// The graph's name in `bench/peer/langgraph.json`.
const GRAPH: &str = "agent";
/// 8 is the level the issue quotes for the peer; 1 shows the cost without queueing.
const CONCURRENCY: [usize; 2] = [1, 8];

pub async fn peer(rows: &mut Vec<Row>) -> Result<()> {
    let system = Arc::new(System::start(None).await?);
    let result = with_dev_server(&system, rows).await;
    // Whatever happened, the database goes (unless an interrupted task still holds it).
    if let Ok(system) = Arc::try_unwrap(system) {
        system.close().await;
    }
    result
}

async fn with_dev_server(system: &Arc<System>, rows: &mut Vec<Row>) -> Result<()> {
    let server = DevServer::start(&system.provider.openai_base_url())?;
    // A Ctrl-C or SIGTERM must still stop the dev server, which may sit in a session of
    // its own where the terminal's signal does not reach it: turn either into an error
    // so that the guard's drop runs.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = measure(system, &server, rows) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
    }
}

async fn measure(system: &Arc<System>, server: &DevServer, rows: &mut Vec<Row>) -> Result<()> {
    let peer = Arc::new(Peer {
        http: reqwest::Client::new(),
        base: format!("http://127.0.0.1:{PORT}"),
    });
    server.wait_ready(&peer).await?;
    eprintln!("bench: LangGraph dev server up on port {PORT}");
    // Every timed call below queues exactly one scripted reply; counted to show at the
    // end whether any request went unscripted.
    let mut scripted = 0;
    for concurrency in CONCURRENCY {
        let mut chats = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..concurrency {
            chats.push(ChatClient::new(system).await?);
            threads.push(GraphClient::new(&peer, system).await?);
        }
        // Warm-up, one turn per client on each side: connections, prepared statements,
        // and LangGraph's lazy imports on its first run.
        let warm = chats.iter().map(|client| client.turn(0));
        for result in futures_util::future::join_all(warm).await {
            result?;
        }
        let warm = threads.iter().map(|client| client.run(0));
        for result in futures_util::future::join_all(warm).await {
            result?;
        }
        scripted += 2 * concurrency;

        let (brain, brain_took) =
            closed_loop(
                window(),
                chats,
                |client, n| async move { client.turn(n).await },
            )
            .await?;
        let (graph, graph_took) =
            closed_loop(
                window(),
                threads,
                |client, n| async move { client.run(n).await },
            )
            .await?;
        // The provider alone at the same concurrency: what both sides' added time is
        // measured against.
        let clients = vec![system.clone(); concurrency];
        let provider_window = window().min(Duration::from_secs(2));
        let (provider, _) = closed_loop(provider_window, clients, |system, _| async move {
            timed_provider(&system).await
        })
        .await?;
        scripted += brain.len() + graph.len() + provider.len();

        let b_first = sorted(brain.iter().map(|s| s.1).collect());
        let b_end = sorted(brain.iter().map(|s| s.2).collect());
        let g_first = sorted(graph.iter().map(|s| s.0).collect());
        let g_end = sorted(graph.iter().map(|s| s.1).collect());
        let p_first = sorted(provider.iter().map(|s| s.0).collect());
        let scenario = format!("peer c={concurrency}");
        let per_second = |n: usize, took: Duration| n as f64 / took.as_secs_f64();
        rows.push(row(
            &scenario,
            "provider TTFB (direct)",
            ms(pct(&p_first, 50.0)),
            ms(pct(&p_first, 99.0)),
            format!("{} requests", provider.len()),
        ));
        rows.push(row(
            &scenario,
            "brain added TTFB (text-delta - provider)",
            signed_ms(pct(&b_first, 50.0), pct(&p_first, 50.0)),
            signed_ms(pct(&b_first, 99.0), pct(&p_first, 99.0)),
            "difference of percentiles".into(),
        ));
        rows.push(row(
            &scenario,
            "LangGraph added TTFB (first token - provider)",
            signed_ms(pct(&g_first, 50.0), pct(&p_first, 50.0)),
            signed_ms(pct(&g_first, 99.0), pct(&p_first, 99.0)),
            "difference of percentiles".into(),
        ));
        rows.push(row(
            &scenario,
            "brain end to end",
            ms(pct(&b_end, 50.0)),
            ms(pct(&b_end, 99.0)),
            format!(
                "{} turns, {:.0} turns/s",
                brain.len(),
                per_second(brain.len(), brain_took)
            ),
        ));
        rows.push(row(
            &scenario,
            "LangGraph end to end",
            ms(pct(&g_end, 50.0)),
            ms(pct(&g_end, 99.0)),
            format!(
                "{} turns, {:.1} turns/s",
                graph.len(),
                per_second(graph.len(), graph_took)
            ),
        ));
        let ratio = |p: f64| {
            let added =
                |first: &[Duration]| pct(first, p).as_secs_f64() - pct(&p_first, p).as_secs_f64();
            let (b, g) = (added(&b_first), added(&g_first));
            // A brain that adds nothing measurable (noise can push the difference below
            // zero) has no meaningful ratio.
            if b > 0.0 {
                format!("{:.0}x", g / b)
            } else {
                "n/a (brain added <= 0)".into()
            }
        };
        rows.push(row(
            &scenario,
            "ratio LangGraph added / brain added",
            ratio(50.0),
            ratio(99.0),
            "added TTFB".into(),
        ));
        eprintln!(
            "bench: peer at concurrency {concurrency} done ({} turns, {} runs)",
            brain.len(),
            graph.len()
        );
    }

    let requests = system.provider.requests().len();
    let violations = system.provider.violations();
    for v in &violations {
        eprintln!("bench: scripted provider violation: {v}");
    }
    // A request beyond the scripted ones (a summary fold, a client retry) took a reply
    // meant for a turn, and the last turn got the provider's slow demo reply instead:
    // said in the table rather than fatal, since it shifts at most a p99.
    let unscripted = requests.saturating_sub(scripted);
    rows.push(row(
        "peer",
        "scripted provider",
        String::new(),
        String::new(),
        format!(
            "{requests} requests, {unscripted} unscripted, {} history violations",
            violations.len()
        ),
    ));
    Ok(())
}

/// One client of the dev server: a thread of its own, renewed every
/// [`TURNS_PER_CHAT`] runs as the brain's clients renew their chats, so both sides carry
/// histories of the same length.
struct GraphClient {
    peer: Arc<Peer>,
    system: Arc<System>,
    thread: Mutex<String>,
}

impl GraphClient {
    async fn new(peer: &Arc<Peer>, system: &Arc<System>) -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            peer: peer.clone(),
            system: system.clone(),
            thread: Mutex::new(peer.thread().await?),
        }))
    }

    async fn run(&self, n: usize) -> Result<(Duration, Duration)> {
        if n % TURNS_PER_CHAT == TURNS_PER_CHAT - 1 {
            let fresh = self.peer.thread().await?;
            *self
                .thread
                .lock()
                .map_err(|_| anyhow!("thread lock poisoned"))? = fresh;
        }
        let thread = self
            .thread
            .lock()
            .map_err(|_| anyhow!("thread lock poisoned"))?
            .clone();
        self.peer.timed_run(&self.system, &thread).await
    }
}

/// A client of the dev server's HTTP API.
struct Peer {
    http: reqwest::Client,
    base: String,
}

impl Peer {
    /// A new thread: one per client, so that runs never queue behind each other on a
    /// thread (LangGraph rejects a second run on a busy thread by default).
    async fn thread(&self) -> Result<String> {
        let response = self
            .http
            .post(format!("{}/threads", self.base))
            .json(&json!({}))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!(
                "POST /threads: {} {}",
                response.status(),
                response.text().await?
            );
        }
        let thread: Value = response.json().await?;
        Ok(thread["thread_id"]
            .as_str()
            .context("POST /threads: no thread_id")?
            .to_owned())
    }

    /// One run streamed to its end: (first event carrying the model's text, end), from the
    /// send. `messages-tuple` is the stream mode that relays the model's tokens as they
    /// come, as `event: messages` with `data: [message chunk, metadata]`.
    async fn timed_run(&self, system: &System, thread: &str) -> Result<(Duration, Duration)> {
        system.provider.push(instant_ok());
        let body = json!({
            "assistant_id": GRAPH,
            "input": {"messages": [{"role": "user", "content": "hi"}]},
            "stream_mode": ["messages-tuple"],
        });
        let started = Instant::now();
        let response = self
            .http
            .post(format!("{}/threads/{thread}/runs/stream", self.base))
            .json(&body)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("run: {} {}", response.status(), response.text().await?);
        }
        let mut stream = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut first_token = None;
        while let Some(piece) = stream.next().await {
            let piece = piece?;
            let now = started.elapsed();
            // Events are separated by a blank line; the server may end lines with CRLF.
            buffer.extend(piece.iter().filter(|b| **b != b'\r'));
            while let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buffer.drain(..at + 2).collect();
                let event = String::from_utf8_lossy(&event);
                let mut name = "message";
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                match name {
                    "error" => bail!("LangGraph run failed: {data}"),
                    "messages" if first_token.is_none() => {
                        let tuple: Value = serde_json::from_str(&data)?;
                        if tuple[0]["content"].as_str().is_some_and(|t| !t.is_empty()) {
                            first_token = Some(now);
                        }
                    }
                    _ => {}
                }
            }
        }
        let end = started.elapsed();
        match first_token {
            Some(first) => Ok((first, end)),
            None => bail!("a LangGraph run streamed no model text"),
        }
    }
}

/// `langgraph dev` as a child process, in a scratch directory of its own (it keeps its
/// in-memory state in `.langgraph_api` under its working directory and resolves the
/// graph's path from there too, so the two files are copied in rather than run in the
/// clone). Dropping it stops the server.
struct DevServer {
    child: tokio::process::Child,
    workdir: PathBuf,
    log: PathBuf,
}

impl DevServer {
    fn start(openai_base_url: &str) -> Result<Self> {
        if std::net::TcpListener::bind(("127.0.0.1", PORT)).is_err() {
            bail!(
                "port {PORT} is taken (listening pids: {:?}): the peer bench runs LangGraph \
                 there; stop whatever holds it",
                listeners(PORT)
            );
        }
        let source = peer_dir();
        let workdir =
            std::env::temp_dir().join(format!("bench-peer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&workdir)?;
        for file in ["langgraph.json", "graph.py"] {
            std::fs::copy(source.join(file), workdir.join(file))
                .with_context(|| format!("{} (BENCH_PEER_DIR)", source.join(file).display()))?;
        }
        let log = workdir.join("langgraph.log");
        let output = std::fs::File::create(&log)?;
        let langgraph =
            std::env::var("BENCH_PEER_LANGGRAPH").unwrap_or_else(|_| "langgraph".to_owned());
        let port = PORT.to_string();
        let child = tokio::process::Command::new(&langgraph)
            .args(["dev", "--no-browser", "--no-reload", "--host", "127.0.0.1"])
            .args(["--port", &port, "--config", "langgraph.json"])
            .current_dir(&workdir)
            .env("OPENAI_BASE_URL", openai_base_url)
            .env("OPENAI_API_KEY", "sk-bench-openai")
            // Without these it tries to reach the internet (shared/TOOLING.md).
            .env("LANGGRAPH_CLI_NO_ANALYTICS", "1")
            .env("LANGGRAPH_NO_VERSION_CHECK", "true")
            .env("LANGSMITH_TRACING", "false")
            .stdin(std::process::Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!("starting {langgraph} (BENCH_PEER_LANGGRAPH; make bench-peer installs it)")
            })?;
        Ok(Self {
            child,
            workdir,
            log,
        })
    }

    /// Waits for `GET /ok`; the first start imports LangChain and takes seconds.
    async fn wait_ready(&self, peer: &Peer) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ok = peer.http.get(format!("{}/ok", peer.base)).send().await;
            if ok.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline || !pid_alive(self.child.id()) {
                bail!(
                    "the LangGraph dev server did not come up; its log: {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for DevServer {
    /// SIGTERM to the child and to whatever listens on the port (the dev server may
    /// re-execute itself in a new session, out of the child's reach), SIGKILL after 5 s.
    fn drop(&mut self) {
        let mut pids: HashSet<u32> = listeners(PORT).into_iter().collect();
        pids.extend(self.child.id());
        signal(&pids, "-TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        let alive = |pids: &HashSet<u32>| {
            pids.iter().any(|pid| pid_alive(Some(*pid))) || !listeners(PORT).is_empty()
        };
        while alive(&pids) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(&pids) {
            pids.extend(listeners(PORT));
            signal(&pids, "-KILL");
            let _ = self.child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// Where `langgraph.json` and `graph.py` are: `BENCH_PEER_DIR` (the script sets it to
/// the clone it runs from), else the source tree this binary was built from.
fn peer_dir() -> PathBuf {
    std::env::var_os("BENCH_PEER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("peer"))
}

fn signal(pids: &HashSet<u32>, which: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([which, &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Whether a process exists and is not a zombie (`/proc/PID/stat`'s state field).
fn pid_alive(pid: Option<u32>) -> bool {
    let Some(pid) = pid else { return false };
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// Pids of the processes holding a TCP socket listening on `port`: the socket inodes from
/// /proc/net/tcp{,6}, then the processes with a descriptor on one of them.
fn listeners(port: u16) -> Vec<u32> {
    let mut sockets = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl, local_address (hex ADDR:PORT), rem_address, st (0A = LISTEN), …, inode.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port)
                && fields.get(3) == Some(&"0A")
                && let Some(inode) = fields.get(9)
            {
                sockets.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if sockets.is_empty() {
        return Vec::new();
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let fds = std::fs::read_dir(entry.path().join("fd")).ok()?;
            fds.flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| sockets.contains(target.to_string_lossy().as_ref()))
                })
                .then_some(pid)
        })
        .collect()
}
