//! Bearer JWTs from a frontend's identity provider (SPEC X1).
//!
//! A token is accepted when it is signed by one of the issuer's keys with the algorithm
//! that key is for (RS256 for RSA, ES256 for P-256, EdDSA for Ed25519; HS256 only with
//! `BRAIN_JWT_HS256_SECRET`, never with a public key as the secret), names the configured
//! issuer and audience, has not expired (give or take `BRAIN_JWT_LEEWAY_S`), and its team
//! claim names an existing, enabled team (`Keys::check_team`, which hears of a team
//! disabled as of a key revoked). Its user claim becomes the principal's user; a `true`
//! admin claim grants the admin scope and the whole team's chats, otherwise the scope is
//! `chat` and the user sees its own chats only.
//!
//! Keys come from `BRAIN_JWT_PUBLIC_KEYS` (PEM or a JWKS, read at start) and from
//! `BRAIN_JWT_JWKS_URL`, fetched under [`FETCH_TIMEOUT`] at first use, again after
//! [`JWKS_MAX_AGE`], and again when a token names a `kid` the set lacks (key rotation),
//! but never more often than `BRAIN_JWT_JWKS_MIN_REFETCH_MS`, so tokens with made-up
//! `kid`s cannot make the brain hammer the issuer. While the set has never been fetched,
//! a token can be neither accepted nor refused: `503 auth_unavailable`.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, UNIX_EPOCH};

use base64::Engine;
use envcfg::{ConfigError, Env, non_empty, ranged, url_var};
use futures_util::StreamExt;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use protocol::TeamId;
use serde_json::{Map, Value};

use super::{AuthError, Principal, Scope};

/// One JWKS fetch, connecting included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// A JWKS larger than this is refused.
const MAX_JWKS_BYTES: usize = 1 << 20;
/// A fetched JWKS is fetched again after this long, so a key the issuer dropped stops
/// working.
const JWKS_MAX_AGE: Duration = Duration::from_secs(300);
const MAX_USER_CHARS: usize = 200;
/// `BRAIN_JWT_JWKS_MIN_REFETCH_MS`' default.
pub const DEFAULT_MIN_REFETCH: Duration = Duration::from_millis(5_000);

/// A public key and the one algorithm it verifies.
#[derive(Clone)]
pub struct VerifyKey {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// `BRAIN_JWT_*`: present when `BRAIN_JWT_ISSUER` is set.
#[derive(Clone)]
pub struct JwtConfig {
    pub issuer: String,
    pub audience: String,
    pub jwks_url: Option<String>,
    pub jwks_min_refetch: Duration,
    pub inline_keys: Vec<VerifyKey>,
    pub hs256_secret: Option<Vec<u8>>,
    pub leeway_s: u64,
    pub team_claim: String,
    pub user_claim: String,
    pub admin_claim: String,
}

impl std::fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtConfig")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("jwks_url", &self.jwks_url)
            .field("inline_keys", &self.inline_keys.len())
            .field("hs256", &self.hs256_secret.is_some())
            .field("leeway_s", &self.leeway_s)
            .finish_non_exhaustive()
    }
}

const VARIABLES: [&str; 10] = [
    "BRAIN_JWT_AUDIENCE",
    "BRAIN_JWT_JWKS_URL",
    "BRAIN_JWT_JWKS_MIN_REFETCH_MS",
    "BRAIN_JWT_PUBLIC_KEYS",
    "BRAIN_JWT_HS256_SECRET",
    "BRAIN_JWT_LEEWAY_S",
    "BRAIN_JWT_TEAM_CLAIM",
    "BRAIN_JWT_USER_CLAIM",
    "BRAIN_JWT_ADMIN_CLAIM",
    "BRAIN_JWT_ISSUER",
];

impl JwtConfig {
    /// `None` when no issuer is configured (then no token is accepted).
    pub fn from_env(env: &dyn Env) -> Result<Option<Self>, ConfigError> {
        let Some(issuer) = non_empty(env, "BRAIN_JWT_ISSUER") else {
            if let Some(name) = VARIABLES.iter().find(|name| non_empty(env, name).is_some()) {
                return Err(ConfigError {
                    name,
                    problem: "is set but BRAIN_JWT_ISSUER is not".into(),
                });
            }
            return Ok(None);
        };
        let audience = non_empty(env, "BRAIN_JWT_AUDIENCE").ok_or(ConfigError {
            name: "BRAIN_JWT_AUDIENCE",
            problem: "must be set with BRAIN_JWT_ISSUER".into(),
        })?;
        let jwks_url = match non_empty(env, "BRAIN_JWT_JWKS_URL") {
            None => None,
            Some(_) => {
                let url = url_var(env, "BRAIN_JWT_JWKS_URL", "")?;
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(ConfigError {
                        name: "BRAIN_JWT_JWKS_URL",
                        problem: "must be an http:// or https:// URL".into(),
                    });
                }
                Some(url)
            }
        };
        let inline_keys = match non_empty(env, "BRAIN_JWT_PUBLIC_KEYS") {
            None => Vec::new(),
            Some(raw) => parse_keys(&raw).map_err(|problem| ConfigError {
                name: "BRAIN_JWT_PUBLIC_KEYS",
                problem: problem.into(),
            })?,
        };
        let hs256_secret = match non_empty(env, "BRAIN_JWT_HS256_SECRET") {
            None => None,
            Some(secret) if secret.len() >= 32 => Some(secret.into_bytes()),
            Some(_) => {
                return Err(ConfigError {
                    name: "BRAIN_JWT_HS256_SECRET",
                    problem: "must have at least 32 bytes".into(),
                });
            }
        };
        if jwks_url.is_none() && inline_keys.is_empty() && hs256_secret.is_none() {
            return Err(ConfigError {
                name: "BRAIN_JWT_ISSUER",
                problem:
                    "needs BRAIN_JWT_JWKS_URL, BRAIN_JWT_PUBLIC_KEYS or BRAIN_JWT_HS256_SECRET"
                        .into(),
            });
        }
        let claim = |name: &'static str, default: &str| {
            non_empty(env, name).unwrap_or_else(|| default.to_owned())
        };
        Ok(Some(Self {
            issuer,
            audience,
            jwks_url,
            jwks_min_refetch: Duration::from_millis(ranged(
                env,
                "BRAIN_JWT_JWKS_MIN_REFETCH_MS",
                DEFAULT_MIN_REFETCH.as_millis() as u64,
                10,
                3_600_000,
            )?),
            inline_keys,
            hs256_secret,
            leeway_s: ranged(env, "BRAIN_JWT_LEEWAY_S", 5, 0, 60)?,
            team_claim: claim("BRAIN_JWT_TEAM_CLAIM", "team_id"),
            user_claim: claim("BRAIN_JWT_USER_CLAIM", "sub"),
            admin_claim: claim("BRAIN_JWT_ADMIN_CLAIM", "admin"),
        }))
    }
}

/// `BRAIN_JWT_PUBLIC_KEYS`: a JWKS (`{"keys":[…]}`) or one or more PEM public keys.
fn parse_keys(raw: &str) -> Result<Vec<VerifyKey>, &'static str> {
    let raw = raw.trim();
    let keys = if raw.starts_with('{') {
        let set: JwkSet = serde_json::from_str(raw).map_err(|_| "is not a valid JWKS")?;
        set.keys.iter().filter_map(key_from_jwk).collect()
    } else {
        parse_pem_keys(raw)?
    };
    if keys.is_empty() {
        return Err("holds no RSA, P-256 or Ed25519 public key");
    }
    Ok(keys)
}

/// The key of a JWK, for the algorithm its type implies; `None` for a key type or
/// algorithm the brain does not accept (secret keys among them).
fn key_from_jwk(jwk: &Jwk) -> Option<VerifyKey> {
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    // A key that says which algorithm it is for is used for that one only.
    if let Some(declared) = jwk.common.key_algorithm
        && declared != KeyAlgorithm::from(alg)
    {
        return None;
    }
    Some(VerifyKey {
        kid: jwk.common.key_id.clone(),
        alg,
        key: DecodingKey::from_jwk(jwk).ok()?,
    })
}

const RSA_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const EC_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const P256_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const ED25519_OID: &[u8] = &[0x2b, 0x65, 0x70];

/// `-----BEGIN PUBLIC KEY-----` blocks (SubjectPublicKeyInfo) and `RSA PUBLIC KEY`
/// blocks (PKCS#1). Only the framing is read here; the key itself is checked by the
/// signature verification.
fn parse_pem_keys(raw: &str) -> Result<Vec<VerifyKey>, &'static str> {
    let mut keys = Vec::new();
    let mut rest = raw;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + 11..];
        let label_end = after.find("-----").ok_or("has a malformed PEM header")?;
        let label = &after[..label_end];
        let body_and_rest = &after[label_end + 5..];
        let end_marker = format!("-----END {label}-----");
        let end = body_and_rest
            .find(&end_marker)
            .ok_or("has a PEM block without its END line")?;
        let body: String = body_and_rest[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| "has a PEM block that is not base64")?;
        let key = match label {
            "PUBLIC KEY" => {
                spki_key(&der).ok_or("has a public key that is not RSA, P-256 or Ed25519")?
            }
            "RSA PUBLIC KEY" => VerifyKey {
                kid: None,
                alg: Algorithm::RS256,
                key: DecodingKey::from_rsa_der(&der),
            },
            _ => return Err("may hold only PUBLIC KEY or RSA PUBLIC KEY PEM blocks"),
        };
        keys.push(key);
        rest = &body_and_rest[end + end_marker.len()..];
    }
    Ok(keys)
}

/// The key of a DER SubjectPublicKeyInfo.
fn spki_key(der: &[u8]) -> Option<VerifyKey> {
    let (spki, _) = der_take(der, 0x30)?;
    let (algorithm, after) = der_take(spki, 0x30)?;
    let (bits, _) = der_take(after, 0x03)?;
    // A BIT STRING's first byte counts the unused bits of its last byte: none for a key.
    let (&0, public) = bits.split_first()? else {
        return None;
    };
    let (oid, params) = der_take(algorithm, 0x06)?;
    let (alg, key) = if oid == RSA_OID {
        (Algorithm::RS256, DecodingKey::from_rsa_der(public))
    } else if oid == EC_OID && der_take(params, 0x06)?.0 == P256_OID {
        (Algorithm::ES256, DecodingKey::from_ec_der(public))
    } else if oid == ED25519_OID {
        (Algorithm::EdDSA, DecodingKey::from_ed_der(public))
    } else {
        return None;
    };
    Some(VerifyKey {
        kid: None,
        alg,
        key,
    })
}

/// The content of the DER element of type `tag` that `input` starts with, and what
/// follows it.
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, b| (len << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A fetched JWKS: `BRAIN_JWT_JWKS_URL`'s, or a team issuer's (`issuers.rs`).
pub(super) struct Jwks {
    url: String,
    client: reqwest::Client,
    min_refetch: Duration,
    /// For a URL a team chose: the connectors' address rule, whether private networks
    /// are allowed. The operator's own URL is trusted.
    address_rule: Option<bool>,
    keys: RwLock<Option<(Arc<Vec<VerifyKey>>, Instant)>>,
    /// Held while fetching, so one fetch runs at a time; the last attempt's time.
    attempt: tokio::sync::Mutex<Option<Instant>>,
}

impl Jwks {
    pub(super) fn new(
        url: String,
        client: reqwest::Client,
        min_refetch: Duration,
        address_rule: Option<bool>,
    ) -> Self {
        Self {
            url,
            client,
            min_refetch,
            address_rule,
            keys: RwLock::new(None),
            attempt: tokio::sync::Mutex::new(None),
        }
    }

    fn current(&self) -> Option<(Arc<Vec<VerifyKey>>, Instant)> {
        self.keys.read().ok()?.clone()
    }

    /// The key set, fetched again first when it is missing, old, or lacks `kid` (and the
    /// last attempt is at least the minimum interval ago). `None`: never fetched.
    pub(super) async fn keys(&self, kid: Option<&str>) -> Option<Arc<Vec<VerifyKey>>> {
        let current = self.current();
        let wanted = match &current {
            None => true,
            Some((keys, at)) => {
                at.elapsed() >= JWKS_MAX_AGE
                    || kid.is_some_and(|kid| !keys.iter().any(|k| k.kid.as_deref() == Some(kid)))
            }
        };
        if !wanted {
            return current.map(|(keys, _)| keys);
        }
        let mut attempt = self.attempt.lock().await;
        // Another request may have fetched while this one waited for the lock.
        let fetched_meanwhile = match (self.current(), &current) {
            (Some((_, now)), Some((_, before))) => now != *before,
            (Some(_), None) => true,
            _ => false,
        };
        if !fetched_meanwhile && attempt.is_none_or(|at| at.elapsed() >= self.min_refetch) {
            *attempt = Some(Instant::now());
            match self.fetch().await {
                Ok(keys) => {
                    if let Ok(mut slot) = self.keys.write() {
                        *slot = Some((Arc::new(keys), Instant::now()));
                    }
                }
                Err(problem) => tracing::warn!(problem, "JWKS fetch failed"),
            }
        }
        drop(attempt);
        self.current().map(|(keys, _)| keys)
    }

    async fn fetch(&self) -> Result<Vec<VerifyKey>, &'static str> {
        // An address literal reaches no resolver: judged here; a name, by the client's.
        if let Some(allow_private) = self.address_rule {
            let url = reqwest::Url::parse(&self.url).map_err(|_| "not a URL")?;
            crate::address::check_url(&url, allow_private)
                .map_err(crate::address::Refused::class)?;
        }
        let body = tokio::time::timeout(FETCH_TIMEOUT, async {
            let response = self
                .client
                .get(&self.url)
                .send()
                .await
                .map_err(|_| "unreachable")?;
            if !response.status().is_success() {
                return Err("answered an error status");
            }
            let mut body = Vec::new();
            let mut chunks = response.bytes_stream();
            while let Some(chunk) = chunks.next().await {
                let chunk = chunk.map_err(|_| "body cut")?;
                if body.len() + chunk.len() > MAX_JWKS_BYTES {
                    return Err("larger than 1 MiB");
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        })
        .await
        .map_err(|_| "timed out")??;
        let set: JwkSet = serde_json::from_slice(&body).map_err(|_| "not a JWKS")?;
        Ok(set.keys.iter().filter_map(key_from_jwk).collect())
    }
}

/// The claims a token names its team, user and scope by, and the clock skew allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimNames {
    pub team: String,
    pub user: String,
    pub admin: String,
    pub leeway_s: u64,
}

impl Default for ClaimNames {
    /// `BRAIN_JWT_*`'s defaults, for team issuers on a server without a deployment issuer.
    fn default() -> Self {
        Self {
            team: "team_id".into(),
            user: "sub".into(),
            admin: "admin".into(),
            leeway_s: 5,
        }
    }
}

/// The `iss` a token says it has, unverified: which issuer's keys to verify it with.
pub fn unverified_issuer(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Map<String, Value> = serde_json::from_slice(&json).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

/// The claims of `token` if one of `candidates` verifies it with `alg` and it names
/// `issuer` and `audience` and is within its validity (give or take `leeway_s`).
pub(super) fn verify(
    token: &str,
    alg: Algorithm,
    candidates: &[DecodingKey],
    issuer: &str,
    audience: &str,
    leeway_s: u64,
) -> Result<Map<String, Value>, AuthError> {
    let mut validation = Validation::new(alg);
    validation.set_issuer(&[issuer]);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation.leeway = leeway_s;
    validation.validate_nbf = true;
    let mut refused = "no key of the issuer verifies the token";
    for key in candidates {
        match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) => {
                refused = match e.kind() {
                    ErrorKind::InvalidSignature => refused,
                    ErrorKind::ExpiredSignature => "token expired",
                    ErrorKind::ImmatureSignature => "token not valid yet",
                    ErrorKind::InvalidAudience => "wrong audience",
                    ErrorKind::InvalidIssuer => "wrong issuer",
                    ErrorKind::MissingRequiredClaim(_) => "token lacks exp, iss or aud",
                    _ => "invalid token",
                };
            }
        }
    }
    Err(AuthError::Refused(refused))
}

/// The principal of verified `claims` in `team`: its user, its scope, when it expires.
pub(super) fn principal_of(
    claims: &Map<String, Value>,
    names: &ClaimNames,
    team: TeamId,
) -> Result<Principal, AuthError> {
    let user = claims
        .get(&names.user)
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty() && u.chars().count() <= MAX_USER_CHARS && !u.contains('\0'))
        .ok_or(AuthError::Refused("user claim missing or malformed"))?;
    let admin = match claims.get(&names.admin) {
        None => false,
        Some(Value::Bool(admin)) => *admin,
        Some(_) => return Err(AuthError::Refused("admin claim is not a boolean")),
    };
    let expires = claims
        .get("exp")
        .and_then(Value::as_f64)
        .map(|exp| exp.max(0.0) as u64 + names.leeway_s + 1)
        .map(|at| UNIX_EPOCH + Duration::from_secs(at));
    Ok(Principal {
        team,
        scope: if admin { Scope::Admin } else { Scope::Chat },
        user: Some(user.to_owned()),
        sees_all_chats: admin,
        key_id: None,
        key: None,
        expires,
    })
}

/// The keys of `set` that may verify a token of `alg` naming `kid`.
pub(super) fn matching(set: &[VerifyKey], alg: Algorithm, kid: Option<&str>) -> Vec<DecodingKey> {
    set.iter()
        .filter(|k| k.alg == alg && (kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid))
        .map(|k| k.key.clone())
        .collect()
}

/// Verifies bearer JWTs and turns them into principals.
#[derive(Clone)]
pub struct JwtVerifier(Arc<Inner>);

struct Inner {
    config: JwtConfig,
    jwks: Option<Jwks>,
}

impl JwtVerifier {
    pub fn new(config: JwtConfig) -> Self {
        let jwks = config.jwks_url.clone().map(|url| {
            let client = reqwest::Client::builder()
                .connect_timeout(FETCH_TIMEOUT)
                .timeout(FETCH_TIMEOUT)
                .build()
                .unwrap_or_default();
            Jwks::new(url, client, config.jwks_min_refetch, None)
        });
        Self(Arc::new(Inner { config, jwks }))
    }

    /// The deployment's issuer (`BRAIN_JWT_ISSUER`).
    pub fn issuer(&self) -> &str {
        &self.0.config.issuer
    }

    /// The least time between two fetches of a JWKS (`BRAIN_JWT_JWKS_MIN_REFETCH_MS`).
    pub fn min_refetch(&self) -> Duration {
        self.0.config.jwks_min_refetch
    }

    /// The claims tokens name their team, user and scope by.
    pub fn claim_names(&self) -> ClaimNames {
        let config = &self.0.config;
        ClaimNames {
            team: config.team_claim.clone(),
            user: config.user_claim.clone(),
            admin: config.admin_claim.clone(),
            leeway_s: config.leeway_s,
        }
    }

    /// The principal of a token; see the module doc for what is accepted.
    pub async fn principal(&self, token: &str) -> Result<Principal, AuthError> {
        let config = &self.0.config;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Refused("malformed token"))?;
        let candidates = self.candidates(header.alg, header.kid.as_deref()).await?;
        let claims = verify(
            token,
            header.alg,
            &candidates,
            &config.issuer,
            &config.audience,
            config.leeway_s,
        )?;
        let team = claims
            .get(&config.team_claim)
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<TeamId>().ok())
            .ok_or(AuthError::Refused("team claim missing or not a team id"))?;
        principal_of(&claims, &self.claim_names(), team)
    }

    async fn candidates(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Vec<DecodingKey>, AuthError> {
        let config = &self.0.config;
        match alg {
            Algorithm::HS256 => {
                let secret = config
                    .hs256_secret
                    .as_deref()
                    .ok_or(AuthError::Refused("algorithm not accepted"))?;
                // Never empty: the configuration requires 32 bytes.
                let key = DecodingKey::from_secret(secret)
                    .map_err(|_| AuthError::Refused("algorithm not accepted"))?;
                return Ok(vec![key]);
            }
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA => {}
            _ => return Err(AuthError::Refused("algorithm not accepted")),
        }
        let mut keys = matching(&config.inline_keys, alg, kid);
        if let Some(jwks) = &self.0.jwks {
            let inline_has_kid = kid.is_some_and(|kid| {
                config
                    .inline_keys
                    .iter()
                    .any(|k| k.kid.as_deref() == Some(kid))
            });
            let wanted_kid = if inline_has_kid { None } else { kid };
            match jwks.keys(wanted_kid).await {
                Some(fetched) => keys.extend(matching(&fetched, alg, kid)),
                None if keys.is_empty() => return Err(AuthError::KeysUnavailable),
                None => {}
            }
        }
        if keys.is_empty() {
            return Err(AuthError::Refused(
                "no key of the issuer verifies the token",
            ));
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use envcfg::vars;

    use super::*;

    #[test]
    fn a_tokens_issuer_is_read_without_verifying_it() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::json!({"iss": "https://id.acme.example", "sub": "u"}).to_string());
        let token = format!("e30.{payload}.c2ln");
        assert_eq!(
            unverified_issuer(&token).as_deref(),
            Some("https://id.acme.example")
        );
        assert_eq!(unverified_issuer("a.b.c"), None);
    }

    const RSA_PUB: &str = include_str!("../../../brain/tests/all/fixtures/jwt/rsa1.pub.pem");
    const EC_PUB: &str = include_str!("../../../brain/tests/all/fixtures/jwt/ec.pub.pem");
    const ED_PUB: &str = include_str!("../../../brain/tests/all/fixtures/jwt/ed.pub.pem");

    #[test]
    fn pem_public_keys_of_each_type() {
        let keys = parse_keys(&format!("{RSA_PUB}\n{EC_PUB}{ED_PUB}")).unwrap();
        let algs: Vec<_> = keys.iter().map(|k| k.alg).collect();
        assert_eq!(algs, [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]);
        for bad in [
            "-----BEGIN PUBLIC KEY-----\nnot base64!\n-----END PUBLIC KEY-----",
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "-----BEGIN PUBLIC KEY-----\nAAAA",
            "no pem at all",
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#,
        ] {
            assert!(parse_keys(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn der_lengths() {
        assert_eq!(
            der_take(&[0x30, 0x01, 0xaa, 0xbb], 0x30),
            Some((&[0xaa][..], &[0xbb][..]))
        );
        assert_eq!(
            der_take(&[0x30, 0x81, 0x01, 0xaa], 0x30),
            Some((&[0xaa][..], &[][..]))
        );
        assert_eq!(
            der_take(&[0x30, 0x05, 0xaa], 0x30),
            None,
            "shorter than it says"
        );
        assert_eq!(der_take(&[0x31, 0x01, 0xaa], 0x30), None, "another tag");
        assert_eq!(der_take(&[0x30, 0x80], 0x30), None, "indefinite length");
    }

    #[test]
    fn configuration() {
        assert!(JwtConfig::from_env(&vars(&[])).unwrap().is_none());
        let err = JwtConfig::from_env(&vars(&[("BRAIN_JWT_AUDIENCE", "x")])).unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_AUDIENCE");
        let base = [
            ("BRAIN_JWT_ISSUER", "https://id.example"),
            ("BRAIN_JWT_AUDIENCE", "brain"),
        ];
        let err = JwtConfig::from_env(&vars(&base)).unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_ISSUER", "a key source is required");
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            JwtConfig::from_env(&vars(&all))
        };
        let config = with(&[("BRAIN_JWT_JWKS_URL", "https://id.example/jwks")])
            .unwrap()
            .unwrap();
        assert_eq!(config.leeway_s, 5);
        assert_eq!(config.jwks_min_refetch, Duration::from_secs(5));
        assert_eq!(
            (
                config.team_claim.as_str(),
                config.user_claim.as_str(),
                config.admin_claim.as_str()
            ),
            ("team_id", "sub", "admin")
        );
        let err = with(&[("BRAIN_JWT_HS256_SECRET", "short-secret")]).unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_HS256_SECRET");
        assert!(!err.to_string().contains("short-secret"));
        let secret = "0123456789abcdef0123456789abcdef-secret";
        let config = with(&[("BRAIN_JWT_HS256_SECRET", secret)])
            .unwrap()
            .unwrap();
        assert!(
            !format!("{config:?}").contains(secret),
            "Debug hides the secret"
        );
        let err = with(&[
            ("BRAIN_JWT_HS256_SECRET", secret),
            ("BRAIN_JWT_LEEWAY_S", "61"),
        ])
        .unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_LEEWAY_S");
        let err = with(&[("BRAIN_JWT_PUBLIC_KEYS", "garbage")]).unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_PUBLIC_KEYS");
        let err = with(&[("BRAIN_JWT_JWKS_URL", "ftp://id.example/jwks")]).unwrap_err();
        assert_eq!(err.name, "BRAIN_JWT_JWKS_URL");
    }
}
