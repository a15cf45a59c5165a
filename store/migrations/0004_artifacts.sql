-- Files and artifacts (SPEC "object storage", W8): the bytes live in the artifact store
-- (a local directory or an S3 bucket) under storage_key; this row is their metadata.
-- storage_key is built from generated ids (<team id>/<artifact id>), never from a name.
-- An artifact belongs to its agent; it outlives the chat and turn it was produced in
-- (those columns become NULL), and goes with the agent's row.

CREATE TABLE artifacts (
    id            uuid PRIMARY KEY,
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    agent_id      uuid NOT NULL,
    chat_id       uuid,
    turn_id       uuid,
    name          text NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    content_type  text NOT NULL CHECK (octet_length(content_type) BETWEEN 3 AND 255),
    size_bytes    bigint NOT NULL CHECK (size_bytes >= 0),
    sha256        text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    storage_key   text NOT NULL UNIQUE CHECK (octet_length(storage_key) BETWEEN 1 AND 512),
    created_at    timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE,
    -- MATCH SIMPLE: a NULL chat_id or turn_id is not checked.
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE SET NULL (chat_id),
    FOREIGN KEY (team_id, turn_id) REFERENCES turns (team_id, id) ON DELETE SET NULL (turn_id)
);
CREATE INDEX artifacts_agent ON artifacts (team_id, agent_id, created_at);
CREATE INDEX artifacts_chat ON artifacts (chat_id, created_at) WHERE chat_id IS NOT NULL;
CREATE INDEX artifacts_turn ON artifacts (turn_id) WHERE turn_id IS NOT NULL;
