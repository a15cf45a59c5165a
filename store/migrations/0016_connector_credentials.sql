-- B1, B2: static credentials of a connector. `headers` (streamable HTTP) and `env` (stdio)
-- map a name to a template whose `{{secret:NAME}}` references are resolved from the agent's
-- or the team's secrets only when the brain connects (brain/src/connectors/credentials.rs);
-- no secret value is ever stored here.
ALTER TABLE connectors
    ADD COLUMN headers jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    ADD COLUMN env     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(env) = 'object'),
    ADD CHECK (url IS NOT NULL OR headers = '{}'),
    ADD CHECK (command IS NOT NULL OR env = '{}'),
    -- A connector's own bound on one tool call; NULL: BRAIN_CONNECTOR_CALL_TIMEOUT_MS.
    ADD COLUMN call_timeout_ms integer CHECK (call_timeout_ms BETWEEN 100 AND 3600000);

-- B1: team-level secrets, set by admins with PUT /v1/secrets/{name}, readable by every
-- agent's connector credentials. AES-GCM ciphertext like `secrets`, bound to (team, name).
CREATE TABLE team_secrets (
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[A-Z0-9_]{1,64}$'),
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, name)
);
