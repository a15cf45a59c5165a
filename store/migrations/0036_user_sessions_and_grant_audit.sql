-- L4: a worker session counts against the budgets of the end user (a JWT's subject) whose
-- turn started it (provisioned it or claimed a pooled worker for it); NULL for an API
-- key's turn, which counts at the team's level only. A later turn of another user that
-- reuses the session does not move it. The billing sweep copies it onto the session's
-- `worker_seconds` events (`billing_events.user_id`), so a user's worker-seconds of a day
-- are its events and the unbilled rest of its sessions.
ALTER TABLE agent_runtime_sessions
    ADD COLUMN user_id text CHECK (octet_length(user_id) BETWEEN 1 AND 255);

-- A user's live sessions are counted at every session start of a user with a session
-- limit: the team's live sessions, by user.
CREATE INDEX sessions_live_user ON agent_runtime_sessions (team_id, user_id)
    WHERE user_id IS NOT NULL AND state NOT IN ('terminated', 'failed');

-- L5: who began a pending OAuth flow (an audit actor: `key` and the key's id, `user` and
-- the token's subject), recorded as the `grant.bound` entry's actor when its callback
-- binds the grant. NULL in flows begun before it was kept (logged as `unknown`).
ALTER TABLE oauth_flows
    ADD COLUMN actor_kind text CHECK (actor_kind IN ('key', 'user', 'operator', 'unknown')),
    ADD COLUMN actor      text CHECK (length(actor) BETWEEN 1 AND 512);
