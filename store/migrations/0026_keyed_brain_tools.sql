-- D3 (issue 26): the brain tools that create something are transactions keyed by their
-- call, so a turn taken over after its replica died mid-call runs the call again and gets
-- the row the first run made, never a second one.
ALTER TABLE memories ADD COLUMN turn_id uuid, ADD COLUMN call_id text;
CREATE UNIQUE INDEX memories_by_call ON memories (turn_id, call_id) WHERE turn_id IS NOT NULL;

ALTER TABLE agents ADD COLUMN created_by_turn uuid, ADD COLUMN created_by_call text;
CREATE UNIQUE INDEX agents_by_call ON agents (created_by_turn, created_by_call)
    WHERE created_by_turn IS NOT NULL;
