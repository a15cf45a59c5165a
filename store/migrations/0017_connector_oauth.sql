-- B2: OAuth for connectors (the MCP authorization flow). Tokens and flow secrets are stored
-- sealed with BRAIN_SECRETS_KEY (AES-256-GCM) and bound, as associated data, to the row's
-- team, connector and user, so a row copied elsewhere does not decrypt. Both tables go
-- with their connector and their team.

-- Lets a grant or flow name its connector together with its team: a row can never point
-- at another team's connector.
CREATE UNIQUE INDEX connectors_team_id ON connectors (team_id, id);

-- A grant: the tokens, expiry, client registration and endpoints (serialized, sealed).
-- `user_id` NULL is the connector's grant (opened by an admin or an API key); otherwise
-- the grant of the JWT user who opened the flow. `version` grows on every write, so a
-- refresh that read an older row knows another replica wrote after it.
CREATE TABLE connector_grants (
    id            uuid PRIMARY KEY,
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    connector_id  uuid NOT NULL,
    user_id       text CHECK (length(user_id) BETWEEN 1 AND 512),
    nonce         bytea NOT NULL,
    ciphertext    bytea NOT NULL,
    version       bigint NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, connector_id) REFERENCES connectors (team_id, id) ON DELETE CASCADE,
    CONSTRAINT connector_grants_owner UNIQUE NULLS NOT DISTINCT (connector_id, user_id)
);

-- A pending authorization: keyed by the SHA-256 of its `state` (the state itself is the
-- callback's capability and is never stored), consumed once by DELETE … RETURNING.
CREATE TABLE oauth_flows (
    state_hash    bytea PRIMARY KEY CHECK (length(state_hash) = 32),
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    connector_id  uuid NOT NULL,
    user_id       text CHECK (length(user_id) BETWEEN 1 AND 512),
    nonce         bytea NOT NULL,
    ciphertext    bytea NOT NULL,
    expires_at    timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, connector_id) REFERENCES connectors (team_id, id) ON DELETE CASCADE
);
CREATE INDEX oauth_flows_connector ON oauth_flows (connector_id, expires_at);
CREATE INDEX oauth_flows_expires ON oauth_flows (expires_at);
