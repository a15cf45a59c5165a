-- D2 (issue 26): the loop's state at a turn's last completed step, written before the next
-- step begins (the assistant parts so far, with the calls a step still runs marked
-- pending; the model calls' usage; the counters). NULL until a step with tool calls.
ALTER TABLE turns ADD COLUMN progress jsonb;
-- D3: how many times a live replica took the turn over from a dead one; at the limit the
-- turn ends `failed` (`takeover_limit`) instead.
ALTER TABLE turns ADD COLUMN takeovers integer NOT NULL DEFAULT 0;
-- X1 for a takeover: whose authority the turn's tools act with (`key:<id>`/`user:<sub>`,
-- never a credential) and whether it may change the agent.
ALTER TABLE turns ADD COLUMN actor text;
ALTER TABLE turns ADD COLUMN actor_admin boolean NOT NULL DEFAULT false;
