//! API keys: lookup, creation and revocation; and whether a team is disabled (L1), which
//! travels the same way.
//!
//! A replica caches the keys it has looked up, so a warm key costs no round trip (every
//! turn starts with one). A revocation must still reach every replica within a second,
//! so the cache is invalidated through Redis: the revoking replica publishes the key's
//! hash (hex, never the key) on [`REVOKED_CHANNEL`] and every replica evicts it.
//!
//! The cache is trusted only while this replica's subscription to that channel is live
//! ([`Keys::watch`]): before the first subscription, while Redis is down and while it
//! resubscribes, every request asks Postgres, and the cache starts empty whenever the
//! subscription comes (back) up, so a revocation published while nobody listened is never
//! missed. A subscription that died silently is found by a ping every [`PING_EVERY`].
//! A lookup that raced an eviction is not cached (the cache's epoch moved meanwhile).
//! [`KEY_CACHE_TTL`] is the backstop for a revocation whose publish failed on the
//! revoking replica (its publish is retried meanwhile).
//!
//! The same message ends what the key holds open here ([`Keys::hold`]: events streams,
//! turn streams). Keys revoked in the last [`KEY_CACHE_TTL`] are remembered, so a stream
//! whose key was checked just before its revocation arrived still ends; and whenever the
//! subscription comes (back) up, the keys of open streams are looked up again, so a
//! revocation published while nobody listened ends them too.
//!
//! A team the operator disables is published on the same channel (`team:<id>`): every
//! replica forgets its cached keys and its cached standing for tokens, and ends what any
//! of its principals holds open. A lookup then finds the team disabled in Postgres.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use protocol::TeamId;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{AuthError, Principal, Scope, bounded};
use store::{Actor, KeyRow, Store, StoreError, key_hash, new_key};

/// The pub/sub channel revoked keys' hashes are published on.
const REVOKED_CHANNEL: &str = "auth:key-revoked";
/// The longest a replica trusts a cached key; see the module doc for why it is a backstop.
const KEY_CACHE_TTL: Duration = Duration::from_secs(30);
/// Bounds the cache's memory.
const KEY_CACHE_MAX: usize = 10_000;
/// Every Redis call, connecting included.
const REDIS_BOUND: Duration = Duration::from_millis(500);
/// How often the subscription is pinged to tell a live one from one that died silently.
const PING_EVERY: Duration = Duration::from_secs(1);
/// The pause before subscribing again after the subscription was lost.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(500);
/// How often a failed publish of a revocation is tried again (until [`KEY_CACHE_TTL`]).
const REPUBLISH_EVERY: Duration = Duration::from_millis(500);

/// Live keys a team may hold.
pub const MAX_KEYS_PER_TEAM: i64 = 100;
const MAX_NAME_CHARS: usize = 200;

/// A key name: 1 to 200 characters, not blank, no NUL (Postgres text cannot hold it).
pub fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err("name must have 1 to 200 characters");
    }
    if name.contains('\0') {
        return Err("name must not contain NUL characters");
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Cached {
    team: TeamId,
    scope: Scope,
    id: Uuid,
}

#[derive(Default)]
struct CacheState {
    /// Moves on every eviction and every change of `live`, so a lookup that started
    /// before one is not cached after it.
    epoch: u64,
    /// Whether the invalidation subscription is live; without it nothing is trusted.
    live: bool,
}

/// Key hash → the key's team and scope, and the teams known enabled (for tokens), as of
/// lookups made while subscribed, each for at most its TTL; when full, the least recently
/// used goes first.
struct KeyCache {
    entries: Cache<[u8; 32], Cached>,
    /// Teams found existing and enabled, for tokens (whose claims name a team).
    teams: Cache<TeamId, ()>,
    /// A team's users found enabled, with the admin claim recorded for them last.
    users: Cache<(TeamId, String), bool>,
    /// Held while an entry is put or evicted, so a put sees the epoch an eviction moved.
    state: Mutex<CacheState>,
}

impl Default for KeyCache {
    fn default() -> Self {
        Self::with_ttl(KEY_CACHE_TTL)
    }
}

impl KeyCache {
    fn with_ttl(ttl: Duration) -> Self {
        Self {
            entries: Cache::builder()
                .max_capacity(KEY_CACHE_MAX as u64)
                .time_to_live(ttl)
                .eviction_policy(EvictionPolicy::lru())
                .support_invalidation_closures()
                .build(),
            teams: Cache::builder()
                .max_capacity(KEY_CACHE_MAX as u64)
                .time_to_live(ttl)
                .eviction_policy(EvictionPolicy::lru())
                .build(),
            users: Cache::builder()
                .max_capacity(KEY_CACHE_MAX as u64)
                .time_to_live(ttl)
                .eviction_policy(EvictionPolicy::lru())
                .build(),
            state: Mutex::default(),
        }
    }

    fn live(&self) -> bool {
        self.state.lock().is_ok_and(|state| state.live)
    }

    fn get(&self, hash: &[u8; 32]) -> Option<(TeamId, Scope, Uuid)> {
        if !self.live() {
            return None;
        }
        let cached = self.entries.get(hash)?;
        Some((cached.team, cached.scope, cached.id))
    }

    /// The epoch a lookup starts in; `None` when its result must not be cached.
    fn epoch(&self) -> Option<u64> {
        let state = self.state.lock().ok()?;
        state.live.then_some(state.epoch)
    }

    fn put(&self, hash: [u8; 32], team: TeamId, scope: Scope, id: Uuid, epoch: u64) {
        if let Ok(state) = self.state.lock()
            && state.live
            && state.epoch == epoch
        {
            self.entries.insert(hash, Cached { team, scope, id });
        }
    }

    fn evict(&self, hash: Option<&[u8; 32]>) {
        if let Ok(mut state) = self.state.lock() {
            match hash {
                Some(hash) => self.entries.invalidate(hash),
                // A message this build cannot read: forget everything rather than guess.
                None => {
                    self.entries.invalidate_all();
                    self.teams.invalidate_all();
                    self.users.invalidate_all();
                }
            }
            state.epoch += 1;
        }
    }

    fn evict_team(&self, team: TeamId) {
        if let Ok(mut state) = self.state.lock() {
            let evicted = self
                .entries
                .invalidate_entries_if(move |_, cached| cached.team == team);
            if evicted.is_err() {
                self.entries.invalidate_all();
            }
            self.teams.invalidate(&team);
            state.epoch += 1;
        }
    }

    /// Whether `sub` of `team` was found enabled with this admin claim recorded.
    fn user_known(&self, team: TeamId, sub: &str, admin: bool) -> bool {
        self.live() && self.users.get(&(team, sub.to_owned())) == Some(admin)
    }

    fn put_user(&self, team: TeamId, sub: &str, admin: bool, epoch: u64) {
        if let Ok(state) = self.state.lock()
            && state.live
            && state.epoch == epoch
        {
            self.users.insert((team, sub.to_owned()), admin);
        }
    }

    fn evict_user(&self, team: TeamId, sub: &str) {
        if let Ok(mut state) = self.state.lock() {
            self.users.invalidate(&(team, sub.to_owned()));
            state.epoch += 1;
        }
    }

    fn team_known(&self, team: TeamId) -> bool {
        self.live() && self.teams.contains_key(&team)
    }

    fn put_team(&self, team: TeamId, epoch: u64) {
        if let Ok(state) = self.state.lock()
            && state.live
            && state.epoch == epoch
        {
            self.teams.insert(team, ());
        }
    }

    fn set_live(&self, live: bool) {
        if let Ok(mut state) = self.state.lock() {
            self.entries.invalidate_all();
            self.teams.invalidate_all();
            self.users.invalidate_all();
            state.epoch += 1;
            state.live = live;
        }
    }
}

/// The long-lived responses open under each key, user and team on this replica, and the
/// keys revoked, users and teams disabled lately. A key's or a user's token is a child of
/// its team's, so disabling the team ends what they hold too.
#[derive(Default)]
struct Holders {
    open: HashMap<[u8; 32], (CancellationToken, usize)>,
    users: HashMap<(TeamId, String), (CancellationToken, usize)>,
    teams: HashMap<TeamId, (CancellationToken, usize)>,
    revoked: HashMap<[u8; 32], Instant>,
    users_disabled: HashMap<(TeamId, String), Instant>,
    disabled: HashMap<TeamId, Instant>,
}

/// Counts one more holder of `id`, making its token with `make` for the first, or afresh
/// when the one held is cancelled: a revocation or disabling ended it, and whoever got past
/// the `lately` checks since holds a standing given back (a user or team enabled again),
/// which must not end with the earlier holders' token.
fn enter<K: std::hash::Hash + Eq>(
    open: &mut HashMap<K, (CancellationToken, usize)>,
    id: K,
    make: impl FnOnce() -> CancellationToken,
) -> CancellationToken {
    use std::collections::hash_map::Entry;
    let (token, count) = match open.entry(id) {
        Entry::Occupied(held) => {
            let held = held.into_mut();
            if held.0.is_cancelled() {
                held.0 = make();
            }
            held
        }
        Entry::Vacant(free) => free.insert((make(), 0)),
    };
    *count += 1;
    token.clone()
}

/// Counts one holder of `id` less, forgetting it with the last.
fn leave<K: std::hash::Hash + Eq>(open: &mut HashMap<K, (CancellationToken, usize)>, id: &K) {
    if let Some((_, count)) = open.get_mut(id) {
        *count -= 1;
        if *count == 0 {
            open.remove(id);
        }
    }
}

/// A principal's place among the responses its key's revocation, its user's or its team's
/// disabling ends; given up when dropped.
pub struct Held {
    holders: Arc<Mutex<Holders>>,
    team: TeamId,
    hash: Option<[u8; 32]>,
    user: Option<String>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut holders) = self.holders.lock() {
            if let Some(hash) = &self.hash {
                leave(&mut holders.open, hash);
            }
            if let Some(user) = self.user.take() {
                leave(&mut holders.users, &(self.team, user));
            }
            leave(&mut holders.teams, &self.team);
        }
    }
}

/// Remembers `id` for [`KEY_CACHE_TTL`] in a map bounded by [`KEY_CACHE_MAX`].
fn remember<K: std::hash::Hash + Eq>(lately: &mut HashMap<K, Instant>, id: K) {
    if lately.len() >= KEY_CACHE_MAX {
        lately.retain(|_, at| at.elapsed() < KEY_CACHE_TTL);
    }
    lately.insert(id, Instant::now());
}

fn lately<K: std::hash::Hash + Eq>(lately: &HashMap<K, Instant>, id: &K) -> bool {
    lately
        .get(id)
        .is_some_and(|at| at.elapsed() < KEY_CACHE_TTL)
}

/// The keys of every team, as this replica sees them.
#[derive(Clone)]
pub struct Keys {
    store: Store,
    redis: crate::redis::Client,
    cache: Arc<KeyCache>,
    holders: Arc<Mutex<Holders>>,
}

impl Keys {
    pub fn new(store: Store, redis: crate::redis::Client) -> Self {
        Self {
            store,
            redis,
            cache: Arc::default(),
            holders: Arc::default(),
        }
    }

    /// A token cancelled when the key (by its hash, for a key's principal) is revoked, the
    /// user (a token's) or `team` is disabled, already cancelled when one was lately; held
    /// until the guard is dropped.
    pub fn hold(
        &self,
        team: TeamId,
        hash: Option<[u8; 32]>,
        user: Option<&str>,
    ) -> (CancellationToken, Option<Held>) {
        let ended = || {
            let token = CancellationToken::new();
            token.cancel();
            (token, None)
        };
        // Nothing could be registered: the stream ends rather than outlive a revocation.
        let Ok(mut holders) = self.holders.lock() else {
            return ended();
        };
        let user = user.map(|user| (team, user.to_owned()));
        if lately(&holders.disabled, &team)
            || hash.is_some_and(|h| lately(&holders.revoked, &h))
            || user
                .as_ref()
                .is_some_and(|u| lately(&holders.users_disabled, u))
        {
            return ended();
        }
        let mut token = enter(&mut holders.teams, team, CancellationToken::new);
        if let Some(user) = &user {
            token = enter(&mut holders.users, user.clone(), || token.child_token());
        }
        if let Some(hash) = hash {
            token = enter(&mut holders.open, hash, || token.child_token());
        }
        let held = Held {
            holders: self.holders.clone(),
            team,
            hash,
            user: user.map(|(_, user)| user),
        };
        (token.child_token(), Some(held))
    }

    /// Forgets a revoked key here and ends what it holds open.
    fn revoked(&self, hash: &[u8; 32]) {
        self.cache.evict(Some(hash));
        if let Ok(mut holders) = self.holders.lock() {
            if let Some((token, _)) = holders.open.get(hash) {
                token.cancel();
            }
            remember(&mut holders.revoked, *hash);
        }
    }

    /// Forgets a disabled team's keys and standing here and ends what its principals hold
    /// open.
    fn team_disabled(&self, team: TeamId) {
        self.cache.evict_team(team);
        if let Ok(mut holders) = self.holders.lock() {
            if let Some((token, _)) = holders.teams.get(&team) {
                token.cancel();
            }
            remember(&mut holders.disabled, team);
        }
    }

    /// Forgets a disabled user's standing here and ends what they hold open.
    fn user_disabled(&self, team: TeamId, sub: &str) {
        self.cache.evict_user(team, sub);
        let user = (team, sub.to_owned());
        if let Ok(mut holders) = self.holders.lock() {
            if let Some((token, _)) = holders.users.get(&user) {
                token.cancel();
            }
            remember(&mut holders.users_disabled, user);
        }
    }

    fn user_enabled(&self, team: TeamId, sub: &str) {
        self.cache.evict_user(team, sub);
        if let Ok(mut holders) = self.holders.lock() {
            holders.users_disabled.remove(&(team, sub.to_owned()));
        }
    }

    fn team_enabled(&self, team: TeamId) {
        if let Ok(mut holders) = self.holders.lock() {
            holders.disabled.remove(&team);
        }
    }

    /// Looks up again the keys and teams of open responses, ending those of keys revoked
    /// or teams disabled meanwhile: for messages this replica may not have heard.
    async fn recheck_held(&self) {
        let (mut keys, mut users, mut teams) = (Vec::new(), Vec::new(), Vec::new());
        if let Ok(holders) = self.holders.lock() {
            keys.extend(holders.open.keys().copied());
            users.extend(holders.users.keys().cloned());
            teams.extend(holders.teams.keys().copied());
        }
        for hash in keys {
            if let Ok(None) = bounded(self.store.key_by_hash(&hash)).await {
                self.revoked(&hash);
            }
        }
        for (team, sub) in users {
            if let Ok(Some(user)) = bounded(self.store.team_user(team, &sub)).await
                && user.disabled
            {
                self.user_disabled(team, &sub);
            }
        }
        for team in teams {
            if let Ok(None | Some(true)) = bounded(self.store.team_disabled(team)).await {
                self.team_disabled(team);
            }
        }
    }

    /// Refuses a token whose team does not exist (`Refused`) or is disabled
    /// (`TeamDisabled`); a team found enabled is trusted as keys are.
    pub async fn check_team(&self, team: TeamId) -> Result<(), AuthError> {
        if self.cache.team_known(team) {
            return Ok(());
        }
        let epoch = self.cache.epoch();
        match bounded(self.store.team_disabled(team)).await? {
            None => Err(AuthError::Refused("unknown team")),
            Some(true) => Err(AuthError::TeamDisabled),
            Some(false) => {
                if let Some(epoch) = epoch {
                    self.cache.put_team(team, epoch);
                }
                Ok(())
            }
        }
    }

    /// Refuses a token whose user an admin disabled (`UserDisabled`), and records the
    /// admin claim of a user's token where it differs from the one recorded: a cadence
    /// whose setter lost admin at the issuer pauses on it (`scheduler.rs`). The brain keeps
    /// no other directory of users.
    pub async fn check_user(&self, team: TeamId, sub: &str, admin: bool) -> Result<(), AuthError> {
        if self.cache.user_known(team, sub, admin) {
            return Ok(());
        }
        let epoch = self.cache.epoch();
        let user = match bounded(self.store.team_user(team, sub)).await? {
            Some(user) if user.admin == Some(admin) => user,
            _ => bounded(self.store.saw_user(team, sub, admin)).await?,
        };
        if user.disabled {
            return Err(AuthError::UserDisabled);
        }
        if let Some(epoch) = epoch {
            self.cache.put_user(team, sub, admin, epoch);
        }
        Ok(())
    }

    /// Disables `sub` of `team` (or enables them again) in Postgres, then tells every
    /// replica (this one first): what they hold open ends, their tokens are refused.
    pub async fn set_user_disabled(
        &self,
        team: TeamId,
        sub: &str,
        disabled: bool,
        by: &Actor,
    ) -> Result<store::TeamUser, StoreError> {
        let user = store::bounded(self.store.set_user_disabled(team, sub, disabled, by)).await?;
        if disabled {
            self.user_disabled(team, sub);
            self.announce(format!("{USER_PREFIX}{team}:{sub}")).await;
        } else {
            self.user_enabled(team, sub);
            self.announce(format!("{USER_ENABLED_PREFIX}{team}:{sub}"))
                .await;
        }
        Ok(user)
    }

    /// The principal of a live API key.
    pub async fn principal(&self, key: &str) -> Result<Principal, AuthError> {
        let hash = key_hash(key);
        if let Some((team, scope, id)) = self.cache.get(&hash) {
            return Ok(Principal::for_key(team, scope, id, hash));
        }
        let epoch = self.cache.epoch();
        let found = bounded(self.store.key_by_hash(&hash))
            .await?
            .ok_or(AuthError::Refused("unknown or revoked API key"))?;
        if found.team_disabled {
            return Err(AuthError::TeamDisabled);
        }
        let scope = Scope::parse(&found.scope).ok_or_else(|| {
            AuthError::Store(StoreError::Corrupt(format!(
                "api key {} has scope {:?}",
                found.id, found.scope
            )))
        })?;
        if let Some(epoch) = epoch {
            self.cache.put(hash, found.team, scope, found.id, epoch);
        }
        Ok(Principal::for_key(found.team, scope, found.id, hash))
    }

    /// A new key of `team` (its name already validated): the row and the only copy of the
    /// secret.
    pub async fn create(
        &self,
        team: TeamId,
        name: &str,
        scope: Scope,
        by: &Actor,
    ) -> Result<(KeyRow, String), StoreError> {
        let secret = new_key();
        let row = store::bounded(self.store.create_key(
            team,
            name,
            scope.as_str(),
            &secret,
            MAX_KEYS_PER_TEAM,
            by,
        ))
        .await?;
        Ok((row, secret))
    }

    /// Revokes the key in Postgres, then tells every replica to forget it.
    pub async fn revoke(&self, team: TeamId, id: Uuid, by: &Actor) -> Result<(), StoreError> {
        let hash = store::bounded(self.store.revoke_key(team, id, by)).await?;
        self.revoked(&hash);
        self.announce(to_hex(&hash)).await;
        Ok(())
    }

    /// Tells every replica (this one first) that `team` was disabled, after Postgres says
    /// so.
    pub async fn disabled(&self, team: TeamId) {
        self.team_disabled(team);
        self.announce(format!("{TEAM_PREFIX}{team}")).await;
    }

    /// Tells every replica that `team` was enabled again, so what its principals open now
    /// is not ended as if it had raced the disabling.
    pub async fn enabled(&self, team: TeamId) {
        self.team_enabled(team);
        self.announce(format!("{TEAM_ENABLED_PREFIX}{team}")).await;
    }

    /// Publishes `message` on [`REVOKED_CHANNEL`]; a failed publish is retried in the
    /// background until the caches' TTL, past which no replica trusts what it tells about.
    async fn announce(&self, message: String) {
        if self.publish(&message).await {
            return;
        }
        tracing::warn!("revocation not published; retrying");
        let keys = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            while started.elapsed() < KEY_CACHE_TTL {
                tokio::time::sleep(REPUBLISH_EVERY).await;
                if keys.publish(&message).await {
                    return;
                }
            }
            tracing::warn!(
                "revocation never published; other replicas forget it by their cache TTL"
            );
        });
    }

    async fn publish(&self, message: &str) -> bool {
        let Ok(mut conn) = crate::redis::bounded(REDIS_BOUND, self.redis.connection()).await else {
            return false;
        };
        crate::redis::bounded(
            REDIS_BOUND,
            conn.publish::<_, _, i64>(REVOKED_CHANNEL, message),
        )
        .await
        .is_ok()
    }

    /// Keeps the invalidation subscription up until `shutdown`; the cache is trusted only
    /// while it is.
    pub async fn watch(self, shutdown: CancellationToken) {
        loop {
            self.watch_once(&shutdown).await;
            self.cache.set_live(false);
            if shutdown.is_cancelled() {
                return;
            }
            tracing::warn!(
                "key revocation subscription lost; API keys are checked in Postgres until it is back"
            );
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RESUBSCRIBE_AFTER) => {}
            }
        }
    }

    /// Serves one subscription until it is lost (or cannot be made).
    async fn watch_once(&self, shutdown: &CancellationToken) {
        let Ok(mut pubsub) = crate::redis::bounded(REDIS_BOUND, self.redis.pubsub()).await else {
            return;
        };
        if crate::redis::bounded(REDIS_BOUND, pubsub.subscribe(REVOKED_CHANNEL))
            .await
            .is_err()
        {
            return;
        }
        let (mut sink, mut messages) = pubsub.split();
        // Starts empty: whatever was revoked while nobody listened is looked up again.
        self.cache.set_live(true);
        tokio::spawn({
            let keys = self.clone();
            async move { keys.recheck_held().await }
        });
        let mut ping = tokio::time::interval(PING_EVERY);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                message = messages.next() => {
                    let Some(message) = message else { return };
                    match parse_message(message.get_payload::<String>().ok().as_deref()) {
                        Some(Revoked::Key(hash)) => self.revoked(&hash),
                        Some(Revoked::Team(team)) => self.team_disabled(team),
                        Some(Revoked::TeamEnabled(team)) => self.team_enabled(team),
                        Some(Revoked::User(team, sub)) => self.user_disabled(team, &sub),
                        Some(Revoked::UserEnabled(team, sub)) => self.user_enabled(team, &sub),
                        None => {
                            self.cache.evict(None);
                            let keys = self.clone();
                            tokio::spawn(async move { keys.recheck_held().await });
                        }
                    }
                }
                _ = ping.tick() => {
                    if crate::redis::bounded(REDIS_BOUND, sink.ping::<redis::Value>()).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The prefix of a disabled team's message, and of one enabled again; a key's is its hash
/// in hex.
const TEAM_PREFIX: &str = "team:";
const TEAM_ENABLED_PREFIX: &str = "team-enabled:";
/// A disabled user's message, and one enabled again: `<prefix><team>:<sub>`.
const USER_PREFIX: &str = "user:";
const USER_ENABLED_PREFIX: &str = "user-enabled:";

enum Revoked {
    Key([u8; 32]),
    Team(TeamId),
    TeamEnabled(TeamId),
    User(TeamId, String),
    UserEnabled(TeamId, String),
}

/// `<team>:<sub>` (a team id holds no `:`; a sub may).
fn team_user(rest: &str) -> Option<(TeamId, String)> {
    let (team, sub) = rest.split_once(':')?;
    Some((team.parse().ok()?, sub.to_owned()))
}

fn parse_message(payload: Option<&str>) -> Option<Revoked> {
    let payload = payload?;
    if let Some(team) = payload.strip_prefix(TEAM_PREFIX) {
        return team.parse().ok().map(Revoked::Team);
    }
    if let Some(team) = payload.strip_prefix(TEAM_ENABLED_PREFIX) {
        return team.parse().ok().map(Revoked::TeamEnabled);
    }
    if let Some(rest) = payload.strip_prefix(USER_PREFIX) {
        return team_user(rest).map(|(team, sub)| Revoked::User(team, sub));
    }
    if let Some(rest) = payload.strip_prefix(USER_ENABLED_PREFIX) {
        return team_user(rest).map(|(team, sub)| Revoked::UserEnabled(team, sub));
    }
    from_hex(payload).map(Revoked::Key)
}

pub(super) fn to_hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_trusted_only_while_live() {
        let cache = KeyCache::default();
        let (hash, team) = (key_hash("ar_one"), TeamId::new());
        assert_eq!(cache.epoch(), None, "not subscribed: nothing is cached");
        cache.put(hash, team, Scope::Chat, Uuid::nil(), 0);
        cache.set_live(true);
        assert_eq!(cache.get(&hash), None);
        let epoch = cache.epoch().unwrap();
        cache.put(hash, team, Scope::Chat, Uuid::nil(), epoch);
        assert_eq!(cache.get(&hash), Some((team, Scope::Chat, Uuid::nil())));
        assert_eq!(cache.get(&key_hash("ar_two")), None);
        cache.put_team(team, cache.epoch().unwrap());
        assert!(cache.team_known(team));
        cache.set_live(false);
        assert_eq!(
            cache.get(&hash),
            None,
            "a lost subscription forgets everything"
        );
        assert!(!cache.team_known(team));
    }

    #[test]
    fn a_key_and_a_team_are_trusted_for_the_ttl_only() {
        let ttl = Duration::from_secs(2);
        let cache = KeyCache::with_ttl(ttl);
        cache.set_live(true);
        let (hash, team) = (key_hash("ar_one"), TeamId::new());
        let cached_at = Instant::now();
        cache.put(hash, team, Scope::Chat, Uuid::nil(), cache.epoch().unwrap());
        cache.put_team(team, cache.epoch().unwrap());
        assert!(cache.get(&hash).is_some() && cache.team_known(team));
        // Looked up a TTL ago: the database is asked again.
        while cache.get(&hash).is_some() || cache.team_known(team) {
            assert!(
                cached_at.elapsed() < ttl * 5,
                "still trusted long past the TTL"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(cached_at.elapsed() >= ttl, "forgotten before the TTL");
    }

    #[test]
    fn a_standing_given_back_is_not_ended_by_the_earlier_holders_token() {
        let mut open: HashMap<&str, (CancellationToken, usize)> = HashMap::new();
        let before = enter(&mut open, "alice", CancellationToken::new);
        before.cancel();
        let after = enter(&mut open, "alice", CancellationToken::new);
        assert!(before.is_cancelled() && !after.is_cancelled());
        assert_eq!(open["alice"].1, 2, "both holders are counted");
        leave(&mut open, &"alice");
        leave(&mut open, &"alice");
        assert!(open.is_empty());
    }

    #[test]
    fn a_users_message_names_the_team_and_the_whole_sub() {
        let team = TeamId::new();
        let parsed = parse_message(Some(&format!("{USER_PREFIX}{team}:idp|a:b")));
        assert!(matches!(parsed, Some(Revoked::User(t, sub)) if t == team && sub == "idp|a:b"));
        let parsed = parse_message(Some(&format!("{USER_ENABLED_PREFIX}{team}:u")));
        assert!(matches!(parsed, Some(Revoked::UserEnabled(t, sub)) if t == team && sub == "u"));
        assert!(parse_message(Some("user:not-a-team:u")).is_none());
    }

    #[test]
    fn a_disabled_team_loses_its_keys_and_no_other() {
        let cache = KeyCache::default();
        cache.set_live(true);
        let (team, other) = (TeamId::new(), TeamId::new());
        let (one, two) = (key_hash("ar_one"), key_hash("ar_two"));
        cache.put(one, team, Scope::Chat, Uuid::nil(), cache.epoch().unwrap());
        cache.put(two, other, Scope::Chat, Uuid::nil(), cache.epoch().unwrap());
        cache.put_team(team, cache.epoch().unwrap());
        cache.evict_team(team);
        assert_eq!(cache.get(&one), None);
        assert!(!cache.team_known(team));
        assert_eq!(cache.get(&two), Some((other, Scope::Chat, Uuid::nil())));
    }

    #[test]
    fn a_lookup_that_raced_an_eviction_is_not_cached() {
        let cache = KeyCache::default();
        cache.set_live(true);
        let hash = key_hash("ar_one");
        let epoch = cache.epoch().unwrap();
        cache.evict(Some(&hash));
        cache.put(hash, TeamId::new(), Scope::Admin, Uuid::nil(), epoch);
        assert_eq!(cache.get(&hash), None);
        let other = key_hash("ar_two");
        cache.put(
            other,
            TeamId::new(),
            Scope::Admin,
            Uuid::nil(),
            cache.epoch().unwrap(),
        );
        cache.evict(None);
        assert_eq!(
            cache.get(&other),
            None,
            "an unreadable message evicts everything"
        );
    }

    #[test]
    fn a_full_cache_keeps_the_newest_within_its_bound() {
        let cache = KeyCache::default();
        cache.set_live(true);
        let epoch = cache.epoch().unwrap();
        for n in 0..KEY_CACHE_MAX {
            cache.put(
                key_hash(&format!("ar_{n}")),
                TeamId::new(),
                Scope::Chat,
                Uuid::nil(),
                epoch,
            );
        }
        let last = key_hash("ar_last");
        cache.put(last, TeamId::new(), Scope::Chat, Uuid::nil(), epoch);
        cache.entries.run_pending_tasks();
        assert_eq!(cache.entries.entry_count(), KEY_CACHE_MAX as u64);
        assert!(cache.get(&last).is_some());
        assert!(
            cache.get(&key_hash("ar_0")).is_none(),
            "the least recent went"
        );
    }

    #[test]
    fn hashes_round_trip_as_hex() {
        let hash = key_hash("ar_x");
        assert_eq!(from_hex(&to_hex(&hash)), Some(hash));
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex(&"é".repeat(32)), None);
    }

    #[test]
    fn names() {
        assert!(validate_name("ci").is_ok());
        assert!(validate_name(&"é".repeat(200)).is_ok());
        for bad in ["", "  ", "a\0b", &"x".repeat(201)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
