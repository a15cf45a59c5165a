-- B2: MCP servers whose tools join a turn's toolset. A connector with agent_id NULL serves
-- every agent of the team; one with an agent_id serves that agent only (and shadows a
-- team-wide connector of the same name). Exactly one transport is set: a streamable HTTP
-- url, or a stdio command (argv, run by the brain when the operator allows it).

CREATE TABLE connectors (
    id          uuid PRIMARY KEY,
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    agent_id    uuid,
    name        text NOT NULL CHECK (name ~ '^[a-z0-9_]{1,32}$'),
    url         text CHECK (url ~ '^https?://' AND length(url) <= 2000),
    command     text[] CHECK (cardinality(command) BETWEEN 1 AND 64),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((url IS NULL) <> (command IS NULL)),
    -- MATCH SIMPLE: a team-wide connector (agent_id NULL) is not checked against agents.
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE
);
-- A name is unique per scope: among the team-wide connectors, and among one agent's.
CREATE UNIQUE INDEX connectors_team_name ON connectors (team_id, name) WHERE agent_id IS NULL;
CREATE UNIQUE INDEX connectors_agent_name ON connectors (agent_id, name) WHERE agent_id IS NOT NULL;
CREATE INDEX connectors_team ON connectors (team_id, created_at);
