//! A team's own JWT issuers: a team's app signs its users' tokens, and a token
//! whose `iss` is a team's issuer (`POST /v1/issuers`) is that team's alone.
//!
//! Such a token is verified against its issuer's JWKS with its issuer's audience, under
//! the same rules as the deployment's tokens (`jwt.rs`: the key's algorithm, never the
//! token's; RS256, ES256 or EdDSA, never HS256; `exp`, `iss`, `aud` required), and its
//! principal's team is the issuer's: a team claim naming another team is refused. The
//! deployment's issuer (`BRAIN_JWT_ISSUER`) stays the operator's, trusted for every team.
//!
//! The JWKS URL is a team's choice, so its fetches obey the connectors' address rule
//! (`connectors/address.rs`: never a metadata address, no private one unless
//! `BRAIN_ISSUERS_ALLOW_PRIVATE_NETWORKS`), follow no redirect and use no proxy; a set is
//! fetched again on an unknown `kid` at most every `BRAIN_JWT_JWKS_MIN_REFETCH_MS`, as the
//! deployment's.
//!
//! Caches, bounded: which team an `iss` is (or that it is none) for [`FOUND_TTL`], so a
//! deleted issuer's tokens are refused within that on every replica (at once on the one
//! that deleted it); each issuer's key set; at most [`MAX_CACHED`] of each, emptied when
//! full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jsonwebtoken::Algorithm;
use protocol::TeamId;
use uuid::Uuid;

use super::jwt::{ClaimNames, Jwks, matching, principal_of, verify};
use super::{AuthError, Principal};
use crate::address;
use store::{IssuerRow, Store};

/// How long a replica trusts what it read of an `iss`.
pub const FOUND_TTL: Duration = Duration::from_secs(10);

/// Entries of each cache.
const MAX_CACHED: usize = 1024;

/// One JWKS fetch, connecting included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// A team issuer as a token's verification needs it.
#[derive(Clone)]
struct Found {
    team: TeamId,
    id: Uuid,
    audience: String,
    jwks_url: String,
}

/// The teams' issuers, as tokens meet them. Cheap to clone.
#[derive(Clone)]
pub struct TeamIssuers(Arc<Inner>);

struct Inner {
    store: Store,
    client: reqwest::Client,
    allow_private: bool,
    names: ClaimNames,
    min_refetch: Duration,
    found: Mutex<HashMap<String, (Option<Found>, Instant)>>,
    jwks: Mutex<HashMap<Uuid, Arc<Jwks>>>,
}

impl TeamIssuers {
    /// Does no I/O. `names` are the deployment's claim names (its defaults without one).
    pub fn new(
        store: Store,
        allow_private: bool,
        names: ClaimNames,
        min_refetch: Duration,
    ) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(FETCH_TIMEOUT)
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(address::CheckedResolver {
                allow_private_networks: allow_private,
            }))
            .build()
            .unwrap_or_default();
        Self(Arc::new(Inner {
            store,
            client,
            allow_private,
            names,
            min_refetch,
            found: Mutex::new(HashMap::new()),
            jwks: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether team issuers may fetch from private networks: the JWKS URL of a new
    /// issuer is judged by it.
    pub fn allow_private(&self) -> bool {
        self.0.allow_private
    }

    /// The principal of `token`, whose `iss` is `iss`, if that is a team's issuer;
    /// `Ok(None)` if it is none.
    pub async fn principal(&self, iss: &str, token: &str) -> Result<Option<Principal>, AuthError> {
        let Some(found) = self.find(iss).await? else {
            return Ok(None);
        };
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| AuthError::Refused("malformed token"))?;
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(AuthError::Refused("algorithm not accepted"));
        }
        let kid = header.kid.as_deref();
        let keys = self
            .jwks_of(&found)
            .keys(kid)
            .await
            .ok_or(AuthError::KeysUnavailable)?;
        let candidates = matching(&keys, header.alg, kid);
        let names = &self.0.names;
        let claims = verify(
            token,
            header.alg,
            &candidates,
            iss,
            &found.audience,
            names.leeway_s,
        )?;
        let team = found.team.to_string();
        if claims
            .get(&names.team)
            .is_some_and(|claimed| claimed.as_str() != Some(team.as_str()))
        {
            return Err(AuthError::Refused(
                "the token's team is not its issuer's team",
            ));
        }
        principal_of(&claims, names, found.team).map(Some)
    }

    /// Forgets what this replica read of `issuer` (it was created or deleted here).
    pub fn forget(&self, issuer: &IssuerRow) {
        if let Ok(mut found) = self.0.found.lock() {
            found.remove(&issuer.issuer);
        }
        if let Ok(mut jwks) = self.0.jwks.lock() {
            jwks.remove(&issuer.id);
        }
    }

    /// The team issuer of `iss`, from the cache while it is fresh.
    async fn find(&self, iss: &str) -> Result<Option<Found>, AuthError> {
        if let Ok(found) = self.0.found.lock()
            && let Some((entry, at)) = found.get(iss)
            && at.elapsed() < FOUND_TTL
        {
            return Ok(entry.clone());
        }
        let read = store::bounded(self.0.store.issuer_by_iss(iss)).await?;
        let entry = read.map(|(team, row)| Found {
            team,
            id: row.id,
            audience: row.audience,
            jwks_url: row.jwks_url,
        });
        if let Ok(mut found) = self.0.found.lock() {
            if found.len() >= MAX_CACHED {
                found.clear();
            }
            found.insert(iss.to_owned(), (entry.clone(), Instant::now()));
        }
        Ok(entry)
    }

    /// The key set of `found`, kept across lookups so its refetch bound holds.
    fn jwks_of(&self, found: &Found) -> Arc<Jwks> {
        let make = || {
            Arc::new(Jwks::new(
                found.jwks_url.clone(),
                self.0.client.clone(),
                self.0.min_refetch,
                Some(self.0.allow_private),
            ))
        };
        let Ok(mut all) = self.0.jwks.lock() else {
            return make();
        };
        if all.len() >= MAX_CACHED && !all.contains_key(&found.id) {
            all.clear();
        }
        all.entry(found.id).or_insert_with(make).clone()
    }
}
