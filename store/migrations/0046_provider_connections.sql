-- T14: a team's own model provider connections. A route `<name>/<model>` names one; the
-- deployment's `openai` and `anthropic` (from the environment) are every team's and no
-- row may take their names. The API key is AES-GCM sealed under BRAIN_SECRETS_KEY, bound
-- to (team, connection id); only its last four characters are kept in the clear.
CREATE TABLE provider_connections (
    id uuid PRIMARY KEY,
    team_id uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$' AND name NOT IN ('openai', 'anthropic')),
    kind text NOT NULL,
    base_url text NOT NULL,
    key_nonce bytea,
    key_ciphertext bytea,
    key_hint text CHECK (char_length(key_hint) <= 4),
    -- Declared models: catalog entries the team adds for this connection.
    models jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(models) = 'array'),
    -- The latest failure of a call through it: a class and a description without any
    -- provider text (`status 401`), and when.
    last_error_class text,
    last_error text,
    last_error_at timestamptz,
    last_check_at timestamptz,
    last_check_latency_ms integer,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((key_nonce IS NULL) = (key_ciphertext IS NULL)),
    CONSTRAINT provider_connections_team_name UNIQUE (team_id, name)
);
CREATE INDEX provider_connections_team ON provider_connections (team_id, created_at, id);
