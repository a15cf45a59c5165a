-- T11: the autostart scheduler.
--
-- `autostart_next_fire_at` is the agent's next tick, computed by the brain from the cadence
-- and `autostart_timezone` (IANA, NULL meaning UTC) whenever the cadence changes and each
-- time a tick is claimed; NULL when no autostart is set. Every replica polls the partial
-- index below for due agents, so a poll is one indexed read whatever the number of agents.
--
-- A tick is claimed by moving `autostart_next_fire_at` forward with a compare-and-set on
-- the value the poll read, in the statement that inserts its `scheduled_tasks` row: of
-- two replicas that saw the same tick, one moves the row and the other updates nothing.
-- The row's UNIQUE (agent_id, kind, due_at) is the backstop.
--
-- `autostart_chat_id` is the one chat the agent's autostart turns run in, created by the
-- first claim.
ALTER TABLE agents
    ADD COLUMN autostart_timezone     text,
    ADD COLUMN autostart_next_fire_at timestamptz,
    ADD COLUMN autostart_chat_id      uuid;

CREATE INDEX agents_autostart_due ON agents (autostart_next_fire_at)
    WHERE autostart_next_fire_at IS NOT NULL AND archived_at IS NULL;

-- What each claimed tick became: `running` while its turn starts, then `fired` (the turn
-- started, `turn_id`), `skipped_busy` (the agent had a turn running; it was not
-- interrupted) or `failed` (`error_code`: a quota, the store, every model route, ...).
ALTER TABLE scheduled_tasks DROP CONSTRAINT scheduled_tasks_state_check;
ALTER TABLE scheduled_tasks ADD CONSTRAINT scheduled_tasks_state_check
    CHECK (state IN ('pending', 'running', 'done', 'skipped', 'failed', 'fired', 'skipped_busy'));
ALTER TABLE scheduled_tasks
    ADD COLUMN chat_id    uuid,
    ADD COLUMN error_code text;

-- `GET /v1/agents/{id}/schedule` reads an agent's latest fires.
CREATE INDEX scheduled_tasks_agent ON scheduled_tasks (agent_id, due_at DESC);
