-- Workspace snapshots (SPEC W10): a session torn down for idleness packs its workspace;
-- the next session of the same (agent, chat) restores it before it is ready.
--
-- On the session row, the manager's request and its outcome: snapshot_state is NULL on
-- every session not torn down for idleness (or whose channel no brain replica held);
-- snapshot_deadline bounds how long the teardown waits for the upload.
ALTER TABLE agent_runtime_sessions
    ADD COLUMN snapshot_state text CHECK (snapshot_state IN
        ('requested', 'stored', 'over_cap', 'failed', 'timed_out')),
    ADD COLUMN snapshot_max_bytes bigint CHECK (snapshot_max_bytes >= 0),
    ADD COLUMN snapshot_deadline timestamptz;

-- At most one snapshot per (agent, chat): the newest. The bytes are in the artifact store
-- under storage_key (<team id>/<snapshot id>, generated ids only).
CREATE TABLE workspace_snapshots (
    id              uuid PRIMARY KEY,
    team_id         uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    agent_id        uuid NOT NULL,
    chat_id         uuid NOT NULL,
    -- The session whose teardown took it (no FK: sessions are never deleted alone).
    session_id      uuid NOT NULL,
    storage_key     text NOT NULL UNIQUE CHECK (octet_length(storage_key) BETWEEN 1 AND 512),
    size_bytes      bigint NOT NULL CHECK (size_bytes >= 0),
    unpacked_bytes  bigint NOT NULL CHECK (unpacked_bytes >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_id, chat_id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id) ON DELETE CASCADE,
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE
);
CREATE INDEX workspace_snapshots_created ON workspace_snapshots (created_at);
CREATE INDEX workspace_snapshots_session ON workspace_snapshots (session_id);

-- Bytes whose row is gone, however it went (replaced by a newer snapshot, dropped over
-- the cap, past retention, or cascaded from its agent, chat or team): the brain's sweep
-- deletes the object, then this row. A trigger, so that no way of deleting a row can
-- forget its bytes.
CREATE TABLE snapshot_blob_garbage (
    storage_key  text PRIMARY KEY,
    queued_at    timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION workspace_snapshot_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO snapshot_blob_garbage (storage_key) VALUES (OLD.storage_key)
        ON CONFLICT DO NOTHING;
    RETURN OLD;
END
$$;

CREATE TRIGGER workspace_snapshots_gone AFTER DELETE ON workspace_snapshots
    FOR EACH ROW EXECUTE FUNCTION workspace_snapshot_gone();
