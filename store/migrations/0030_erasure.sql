-- L2 (issue 29): deletion that takes everything.
--
-- The bytes of a deleted artifact or snapshot are queued in the row's own transaction and
-- deleted from the object store after it commits (by the deleting request, and by the
-- sweep of every replica for what that missed): no path deletes a row and forgets its
-- bytes. The queue served snapshots alone until now.
ALTER TABLE snapshot_blob_garbage RENAME TO blob_garbage;

DROP TRIGGER workspace_snapshots_gone ON workspace_snapshots;
DROP FUNCTION workspace_snapshot_gone();

CREATE FUNCTION blob_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO blob_garbage (storage_key) VALUES (OLD.storage_key) ON CONFLICT DO NOTHING;
    RETURN OLD;
END
$$;

CREATE TRIGGER workspace_snapshots_gone AFTER DELETE ON workspace_snapshots
    FOR EACH ROW EXECUTE FUNCTION blob_gone();
CREATE TRIGGER artifacts_gone AFTER DELETE ON artifacts
    FOR EACH ROW EXECUTE FUNCTION blob_gone();

-- Approvals had no cascade: a chat's or agent's erasure deletes them itself, and the
-- indexes find them by chat and by agent.
CREATE INDEX approvals_agent ON approvals (team_id, agent_id);

-- A team the operator erases keeps its row (the tombstone billing_events and usage point
-- at, the operator's records) and loses everything else, one agent at a time, by whichever
-- replica holds the erasure's lease; a replica that dies mid-erasure leaves the lease to
-- lapse and another finishes.
ALTER TABLE teams
    ADD COLUMN erasing_at timestamptz,
    ADD COLUMN erased_at timestamptz,
    ADD COLUMN erase_lease_until timestamptz;
CREATE INDEX teams_erasing ON teams (erasing_at) WHERE erasing_at IS NOT NULL AND erased_at IS NULL;

-- A chat's erasure cascades to its sessions and snapshots; their foreign keys had no index
-- to find them by chat (each cascade would scan the table).
CREATE INDEX sessions_chat ON agent_runtime_sessions (team_id, chat_id);
CREATE INDEX workspace_snapshots_chat ON workspace_snapshots (team_id, chat_id);
