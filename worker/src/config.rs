//! The worker's configuration, read from the environment before anything else happens.
//!
//! Every variable is documented in `worker/README.md`. Parsing goes through [`Env`]
//! so tests can feed a map instead of the process environment. A bad or missing variable
//! is a [`ConfigError`] that names the variable and never carries its value (the token is
//! a secret); `main` turns it into exit code 2.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envcfg::trimmed;
pub use envcfg::{ConfigError, Env, ProcessEnv};
use protocol::SessionId;
use protocol::channel::CONNECT_PATH;

pub const BRAIN_PUBLIC_URL: &str = "BRAIN_PUBLIC_URL";
pub const WORKER_SESSION_ID: &str = "WORKER_SESSION_ID";
pub const WORKER_SESSION_TOKEN: &str = "WORKER_SESSION_TOKEN";
/// `WORKER_SESSION_TOKEN` set to this: the token comes on standard input (the local
/// launcher's way), since an environment stays readable in `/proc` for the life of the
/// process, and of bwrap's init above it.
pub const TOKEN_ON_STDIN: &str = "-";
pub const WORKER_WORKSPACE: &str = "WORKER_WORKSPACE";
/// Optional: the tool catalog to serve, a profile name of `channel::catalog` (default
/// `light`). `browser` adds the browser tools (it needs the `browser` feature).
pub const WORKER_PROFILE: &str = "WORKER_PROFILE";
/// Optional: `true` to restore the chat's workspace snapshot before the first dial (the
/// runtime-manager sets it when the profile keeps snapshots, W10); default `false`.
pub const WORKER_RESTORE: &str = "WORKER_RESTORE";
/// Optional: the Chromium executable for the browser tools (default: the first of
/// [`CHROMIUM_CANDIDATES`] that exists).
pub const WORKER_CHROMIUM: &str = "WORKER_CHROMIUM";
/// Optional: milliseconds without a browser tool call after which Chromium is stopped
/// (default [`DEFAULT_BROWSER_IDLE`]); the next browser tool starts it again.
pub const WORKER_BROWSER_IDLE_MS: &str = "WORKER_BROWSER_IDLE_MS";
/// Where Chromium is looked for when `WORKER_CHROMIUM` is unset, in order.
pub const CHROMIUM_CANDIDATES: [&str; 3] = [
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
];
pub const DEFAULT_BROWSER_IDLE: Duration = Duration::from_secs(120);
/// Chromium's profile directory, under the workspace (the pod is the tenant's, the
/// workspace the session's).
pub const BROWSER_PROFILE_DIR: &str = ".browser-profile";
/// Optional: a `tracing` filter (default `info`). Dependencies are always capped (rmcp
/// and chromiumoxide at `error`, the others at `warn`) because they log payloads (X4).
pub const WORKER_LOG: &str = "WORKER_LOG";
/// Optional: the session's egress proxy, an `http://` URL (with the session's credential
/// as userinfo where the proxy is shared): the commands' `HTTP(S)_PROXY`, and where the
/// session CA is fetched (W14).
pub const WORKER_EGRESS_PROXY: &str = "WORKER_EGRESS_PROXY";
/// Optional: `ADDR=SOCKET[,ADDR=SOCKET]`: loopback addresses the worker listens on inside
/// its sandbox, each carried to a unix socket bound in from outside (the local launcher's
/// network confinement).
pub const WORKER_EGRESS_BRIDGE: &str = "WORKER_EGRESS_BRIDGE";

fn invalid(name: &'static str, problem: &'static str) -> ConfigError {
    ConfigError {
        name,
        problem: problem.into(),
    }
}

/// The session token. Its `Debug` never shows the value, so a config printed by mistake
/// leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The worker's whole configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The channel endpoint: `ws(s)://host:port[/prefix]/v1/worker/connect`.
    pub connect_url: String,
    pub session: SessionId,
    pub token: Token,
    /// The workspace directory, created if missing, canonical (symlinks resolved).
    pub workspace: PathBuf,
    /// The profile whose worker tools are served (`channel::catalog::catalog_for`).
    pub profile: String,
    /// The browser tools' settings (used only when the profile serves them).
    pub browser: BrowserSettings,
    /// Restore the chat's workspace snapshot before the first dial (`WORKER_RESTORE`, W10).
    pub restore: bool,
    /// The session's egress proxy (`WORKER_EGRESS_PROXY`).
    pub egress_proxy: Option<String>,
    /// The bridges out of the sandbox (`WORKER_EGRESS_BRIDGE`), started before anything
    /// dials.
    pub egress_bridges: Vec<crate::egress::Bridge>,
}

/// How the browser tools run Chromium.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrowserSettings {
    /// The executable; `None` when none was found (a browser tool then says so).
    pub chromium: Option<PathBuf>,
    /// Idle time after which Chromium is stopped.
    pub idle: Duration,
    /// `--user-data-dir`: `<workspace>/.browser-profile`, kept across restarts.
    pub profile_dir: PathBuf,
    /// The session's egress proxy (`WORKER_EGRESS_PROXY`): Chromium's way out too, loopback
    /// included (its own default bypasses loopback).
    pub proxy: Option<String>,
}

impl BrowserSettings {
    /// Defaults for `workspace`: Chromium found on the usual paths, 120 s idle.
    pub fn defaults(workspace: &Path) -> Self {
        Self {
            chromium: CHROMIUM_CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|path| path.is_file()),
            idle: DEFAULT_BROWSER_IDLE,
            profile_dir: workspace.join(BROWSER_PROFILE_DIR),
            proxy: None,
        }
    }
}

impl Config {
    /// Reads and validates every variable; creates the workspace directory if missing.
    pub fn from_env(env: &dyn Env) -> Result<Self, ConfigError> {
        let required = |name: &'static str| trimmed(env, name).ok_or(invalid(name, "is not set"));
        let connect_url = connect_url(&required(BRAIN_PUBLIC_URL)?)?;
        let session = required(WORKER_SESSION_ID)?
            .parse::<SessionId>()
            .map_err(|_| invalid(WORKER_SESSION_ID, "is not a UUID"))?;
        let token = session_token(required(WORKER_SESSION_TOKEN)?, session)?;
        let workspace = PathBuf::from(required(WORKER_WORKSPACE)?);
        std::fs::create_dir_all(&workspace)
            .map_err(|_| invalid(WORKER_WORKSPACE, "cannot be created"))?;
        let workspace = workspace
            .canonicalize()
            .map_err(|_| invalid(WORKER_WORKSPACE, "cannot be resolved"))?;
        if !workspace.is_dir() {
            return Err(invalid(WORKER_WORKSPACE, "is not a directory"));
        }
        let profile = trimmed(env, WORKER_PROFILE).unwrap_or_else(|| "light".to_owned());
        let tools = channel::catalog::catalog_for(&profile);
        if tools.is_empty() {
            return Err(invalid(
                WORKER_PROFILE,
                "names no profile with worker tools (light, heavy, warm, browser)",
            ));
        }
        if !cfg!(feature = "browser") && tools.iter().any(|t| t.name.starts_with("browser_")) {
            return Err(invalid(
                WORKER_PROFILE,
                "needs the browser tools, but this worker build has no `browser` feature \
                 (use the worker-browser image)",
            ));
        }
        let mut browser = BrowserSettings::defaults(&workspace);
        if let Some(path) = trimmed(env, WORKER_CHROMIUM) {
            let path = PathBuf::from(path);
            if !path.is_file() {
                return Err(invalid(WORKER_CHROMIUM, "is not an existing file"));
            }
            browser.chromium = Some(path);
        }
        if let Some(ms) = trimmed(env, WORKER_BROWSER_IDLE_MS) {
            browser.idle = ms
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or(invalid(
                    WORKER_BROWSER_IDLE_MS,
                    "must be a positive number of milliseconds",
                ))?;
        }
        let restore = match trimmed(env, WORKER_RESTORE).as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(invalid(WORKER_RESTORE, "must be true or false")),
        };
        let egress_proxy = trimmed(env, WORKER_EGRESS_PROXY);
        if let Some(proxy) = &egress_proxy
            && !proxy.starts_with("http://")
        {
            return Err(invalid(WORKER_EGRESS_PROXY, "must be an http:// URL"));
        }
        let egress_bridges = match trimmed(env, WORKER_EGRESS_BRIDGE) {
            None => Vec::new(),
            Some(raw) => bridges(&raw).ok_or(invalid(
                WORKER_EGRESS_BRIDGE,
                "must be ADDR=SOCKET[,ADDR=SOCKET]",
            ))?,
        };
        browser.proxy.clone_from(&egress_proxy);
        Ok(Self {
            restore,
            egress_proxy,
            egress_bridges,
            connect_url,
            session,
            token: Token::new(token),
            workspace,
            profile,
            browser,
        })
    }
}

/// The session token as given (or `-`: read from standard input), checked: printable
/// ASCII, and claims that name `session`.
fn session_token(given: String, session: SessionId) -> Result<String, ConfigError> {
    let token = match given {
        given if given == TOKEN_ON_STDIN => token_from_stdin()?,
        given => given,
    };
    // It travels in an HTTP header: visible ASCII only.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            WORKER_SESSION_TOKEN,
            "must be printable ASCII without spaces",
        ));
    }
    // Its expiry bounds re-dialing (W9); what it names must be the session.
    match channel::token::read_claims(&token) {
        Ok(claims) if claims.sub == session => {}
        Ok(_) => {
            return Err(invalid(
                WORKER_SESSION_TOKEN,
                "names another session than WORKER_SESSION_ID",
            ));
        }
        Err(_) => {
            return Err(invalid(
                WORKER_SESSION_TOKEN,
                "is not a session or pool token (its claims cannot be read)",
            ));
        }
    }
    Ok(token)
}

/// `127.0.0.1:3128=/run/egress/proxy.sock,…`: loopback addresses and absolute socket
/// paths only.
fn bridges(raw: &str) -> Option<Vec<crate::egress::Bridge>> {
    raw.split(',')
        .map(|pair| {
            let (listen, socket) = pair.trim().split_once('=')?;
            let listen: std::net::SocketAddr = listen.parse().ok()?;
            let socket = PathBuf::from(socket);
            (listen.ip().is_loopback() && socket.is_absolute())
                .then_some(crate::egress::Bridge { listen, socket })
        })
        .collect()
}

/// The token written to standard input, up to its end (bounded: a token is a few hundred
/// bytes).
fn token_from_stdin() -> Result<String, ConfigError> {
    use std::io::Read;
    let mut token = String::new();
    std::io::stdin()
        .lock()
        .take(16 * 1024)
        .read_to_string(&mut token)
        .map_err(|_| {
            invalid(
                WORKER_SESSION_TOKEN,
                "is `-`, but standard input is unreadable",
            )
        })?;
    match token.trim() {
        "" => Err(invalid(
            WORKER_SESSION_TOKEN,
            "is `-`, but standard input held no token",
        )),
        token => Ok(token.to_owned()),
    }
}

/// `http(s)://host:port[/prefix]` (or already `ws(s)://`) → the channel endpoint URL.
fn connect_url(base: &str) -> Result<String, ConfigError> {
    let bad = |problem| invalid(BRAIN_PUBLIC_URL, problem);
    let (scheme, rest) = base
        .split_once("://")
        .ok_or(bad("must be an http:// or https:// URL"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        _ => return Err(bad("must be an http:// or https:// URL")),
    };
    if scheme == "wss" && !cfg!(feature = "tls") {
        return Err(bad(
            "is https, but this worker build has no TLS: dial the brain's in-cluster http:// \
             address or terminate TLS in a proxy",
        ));
    }
    if rest.contains(['?', '#']) {
        return Err(bad("must not carry a query or fragment"));
    }
    let rest = rest.trim_end_matches('/');
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("must name a host (and no credentials)"));
    }
    let url = format!("{scheme}://{rest}{CONNECT_PATH}");
    url.parse::<tokio_tungstenite::tungstenite::http::Uri>()
        .map_err(|_| bad("is not a valid URL"))?;
    Ok(url)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::HashMap;

    use envcfg::vars as env;

    use super::*;

    const SESSION: &str = "0190b1b8-8a7e-7cc0-8f1e-2f6a3c2b9d10";

    fn token_for(session: &str) -> String {
        // The worker never checks a signature: any key mints its tokens.
        channel::token::TokenKeys::new(b"any key of 32 bytes or more, for tests")
            .unwrap()
            .mint(
                session.parse().unwrap(),
                protocol::TeamId::new(),
                protocol::AgentId::new(),
                Duration::from_secs(60),
            )
            .unwrap()
    }

    fn good(workspace: &str) -> HashMap<String, String> {
        env(&[
            (BRAIN_PUBLIC_URL, "http://127.0.0.1:8080/"),
            (WORKER_SESSION_ID, SESSION),
            (WORKER_SESSION_TOKEN, &token_for(SESSION)),
            (WORKER_WORKSPACE, workspace),
        ])
    }

    #[test]
    fn a_complete_environment_parses_and_creates_the_workspace() {
        let dir = std::env::temp_dir().join(format!("worker-config-{}", std::process::id()));
        let ws = dir.join("nested/ws");
        let vars = good(ws.to_str().unwrap());
        let config = Config::from_env(&vars).unwrap();
        assert_eq!(config.connect_url, "ws://127.0.0.1:8080/v1/worker/connect");
        assert!(config.workspace.is_dir());
        assert!(!format!("{config:?}").contains(&vars[WORKER_SESSION_TOKEN]));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn each_bad_variable_is_named_without_its_value() {
        let ws = std::env::temp_dir().to_string_lossy().into_owned();
        for (name, value) in [
            (BRAIN_PUBLIC_URL, "ftp://x"),
            (BRAIN_PUBLIC_URL, "127.0.0.1:8080"),
            (BRAIN_PUBLIC_URL, "http://"),
            (WORKER_SESSION_ID, "not-a-uuid"),
            (WORKER_SESSION_TOKEN, "secret with space"),
            (WORKER_SESSION_TOKEN, ""),
            (WORKER_SESSION_TOKEN, "not.a.token"),
            (
                WORKER_SESSION_TOKEN,
                &token_for("0190b1b8-8a7e-7cc0-8f1e-000000000000"),
            ),
            (WORKER_PROFILE, "none"),
            (WORKER_PROFILE, "gpu"),
            (WORKER_CHROMIUM, "/nonexistent/chromium"),
            (WORKER_BROWSER_IDLE_MS, "0"),
            (WORKER_BROWSER_IDLE_MS, "soon"),
        ] {
            let mut vars = good(&ws);
            vars.insert(name.to_owned(), value.to_owned());
            let err = Config::from_env(&vars).unwrap_err();
            assert_eq!(err.name, name, "{value}");
            if !value.is_empty() {
                assert!(!err.to_string().contains(value), "{err}");
            }
        }
        let mut vars = good(&ws);
        vars.remove(WORKER_WORKSPACE);
        assert_eq!(Config::from_env(&vars).unwrap_err().name, WORKER_WORKSPACE);
    }

    #[test]
    fn profile_and_browser_settings() {
        let ws = std::env::temp_dir().to_string_lossy().into_owned();
        let config = Config::from_env(&good(&ws)).unwrap();
        assert_eq!(config.profile, "light");
        assert_eq!(config.browser.idle, DEFAULT_BROWSER_IDLE);
        assert_eq!(
            config.browser.profile_dir,
            config.workspace.join(".browser-profile")
        );
        let mut vars = good(&ws);
        vars.insert(WORKER_PROFILE.into(), "browser".into());
        vars.insert(WORKER_BROWSER_IDLE_MS.into(), "300".into());
        vars.insert(WORKER_CHROMIUM.into(), "/bin/sh".into());
        let parsed = Config::from_env(&vars);
        if cfg!(feature = "browser") {
            let config = parsed.unwrap();
            assert_eq!(config.profile, "browser");
            assert_eq!(config.browser.idle, Duration::from_millis(300));
            assert_eq!(config.browser.chromium, Some(PathBuf::from("/bin/sh")));
        } else {
            assert_eq!(parsed.unwrap_err().name, WORKER_PROFILE);
        }
    }

    #[test]
    fn https_becomes_wss_when_tls_is_built_in() {
        let url = connect_url("https://brain.example.com");
        if cfg!(feature = "tls") {
            assert_eq!(url.unwrap(), "wss://brain.example.com/v1/worker/connect");
        } else {
            assert_eq!(url.unwrap_err().name, BRAIN_PUBLIC_URL);
        }
        assert_eq!(
            connect_url("ws://10.0.0.1:8080").unwrap(),
            "ws://10.0.0.1:8080/v1/worker/connect"
        );
    }

    #[test]
    fn a_path_prefix_is_kept() {
        assert_eq!(
            connect_url("http://brain.ns.svc:80/agents").unwrap(),
            "ws://brain.ns.svc:80/agents/v1/worker/connect"
        );
    }
}
