//! A task's push notification configs as A2A sends them, checked before they are kept:
//! an `http(s)` URL, bounded fields, a bounded number per task. Whether a URL may be
//! reached (no metadata or private addresses) is the delivery's rule, decided when
//! a notification goes out.

use super::wire::PushConfig;
use protocol::TurnId;

/// The most configs one task keeps.
pub const MAX_PER_TASK: i64 = 10;
const MAX_URL: usize = 2048;
const MAX_ID: usize = 200;
const MAX_TOKEN: usize = 1024;
const MAX_CREDENTIALS: usize = 4096;
const MAX_SCHEME: usize = 64;

/// `config` for task `turn` as stored, its id made when the client gave none; the reason
/// when it is not acceptable.
pub fn validate(turn: TurnId, config: PushConfig) -> Result<store::PushConfig, String> {
    let url = config.url.trim();
    if url.len() > MAX_URL {
        return Err(format!("url must have at most {MAX_URL} bytes"));
    }
    let parsed = url::Url::parse(url).map_err(|_| "url is not an absolute URL".to_owned())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err("url must be an http or https URL with a host".into());
    }
    let id = if config.id.is_empty() {
        uuid::Uuid::now_v7().to_string()
    } else {
        config.id
    };
    let bounded = |what: &str, value: &str, max: usize| {
        if value.len() > max || value.contains('\0') {
            Err(format!("{what} must have at most {max} bytes and no NUL"))
        } else {
            Ok(())
        }
    };
    bounded("id", &id, MAX_ID)?;
    if let Some(token) = &config.token {
        bounded("token", token, MAX_TOKEN)?;
    }
    let (scheme, credentials) = match config.authentication {
        Some(auth) => {
            if auth.scheme.trim().is_empty() {
                return Err("authentication.scheme is empty".into());
            }
            bounded("authentication.scheme", &auth.scheme, MAX_SCHEME)?;
            if let Some(c) = &auth.credentials {
                bounded("authentication.credentials", c, MAX_CREDENTIALS)?;
            }
            (Some(auth.scheme), auth.credentials)
        }
        None => (None, None),
    };
    Ok(store::PushConfig {
        id,
        turn,
        url: parsed.to_string(),
        token: config.token,
        auth_scheme: scheme,
        auth_credentials: credentials,
    })
}

/// A config as A2A shows it: never its token or `authentication.credentials`, which are
/// the receiver's secrets and are sealed once kept (the scheme is shown).
pub fn shown(config: store::PushConfig) -> PushConfig {
    PushConfig {
        id: config.id,
        task_id: config.turn.to_string(),
        url: config.url,
        token: None,
        authentication: config
            .auth_scheme
            .map(|scheme| super::wire::Authentication {
                scheme,
                credentials: None,
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> PushConfig {
        PushConfig {
            id: String::new(),
            task_id: String::new(),
            url: url.into(),
            token: None,
            authentication: None,
        }
    }

    #[test]
    fn only_http_urls_with_a_host_are_kept() {
        let turn = TurnId::new();
        assert!(validate(turn, config("https://hooks.example.com/a2a")).is_ok());
        for bad in ["ftp://x/y", "not a url", "file:///etc/passwd", ""] {
            assert!(validate(turn, config(bad)).is_err(), "{bad}");
        }
        let long = format!("https://x.example/{}", "a".repeat(MAX_URL));
        assert!(validate(turn, config(&long)).is_err());
        let made = validate(turn, config("http://127.0.0.1:9/p")).unwrap();
        assert!(!made.id.is_empty(), "an id is made when none is given");
    }
}
