-- X1: API keys carry a name and a scope; chats record the user who opened them.

-- Every key issued before scopes existed was a team's bootstrap key, which is `admin`.
ALTER TABLE api_keys
    ADD COLUMN name  text NOT NULL DEFAULT 'bootstrap'
        CHECK (length(name) BETWEEN 1 AND 200),
    ADD COLUMN scope text NOT NULL DEFAULT 'admin' CHECK (scope IN ('admin', 'chat'));
ALTER TABLE api_keys ALTER COLUMN name DROP DEFAULT, ALTER COLUMN scope DROP DEFAULT;
-- GET /v1/keys lists a team's live keys; the last-admin-key rule counts them.
CREATE INDEX api_keys_team_live ON api_keys (team_id, created_at) WHERE revoked_at IS NULL;

-- The JWT user claim of the token that opened the chat; NULL for an API key.
ALTER TABLE chats ADD COLUMN created_by text;
-- GET /v1/agents/{id}/chats: newest first, optionally one user's.
CREATE INDEX chats_agent_newest ON chats (team_id, agent_id, created_at DESC);
CREATE INDEX agents_team_newest ON agents (team_id, created_at DESC) WHERE archived_at IS NULL;
