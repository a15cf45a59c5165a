-- L5 (issue 29): the audit log of admin actions. Each entry is written in the transaction
-- of the change it records, so an entry exists exactly when its change does.
--
-- `actor` is a key's id or a token's subject (`operator` for the operator), never a
-- credential; `details` holds non-secret facts only (the names of changed fields, never a
-- secret's value or a prompt). Entries older than BRAIN_AUDIT_RETENTION_DAYS are swept.
CREATE TABLE audit_log (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    actor_kind  text NOT NULL CHECK (actor_kind IN ('key', 'user', 'operator', 'unknown')),
    actor       text NOT NULL CHECK (length(actor) BETWEEN 1 AND 512),
    action      text NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    object_kind text NOT NULL CHECK (length(object_kind) BETWEEN 1 AND 32),
    object_id   text NOT NULL CHECK (length(object_id) BETWEEN 1 AND 512),
    -- The client's address as the brain saw it (behind a proxy, the proxy's); none for a
    -- tool call, which the model made.
    address     inet,
    details     jsonb NOT NULL DEFAULT '{}'
);
-- The listing, newest first, and its filters by object and by actor.
CREATE INDEX audit_log_team ON audit_log (team_id, created_at DESC, id DESC);
CREATE INDEX audit_log_object ON audit_log (team_id, object_id, created_at DESC, id DESC);
CREATE INDEX audit_log_actor ON audit_log (team_id, actor, created_at DESC, id DESC);
-- The retention sweep, across teams.
CREATE INDEX audit_log_at ON audit_log (created_at);
