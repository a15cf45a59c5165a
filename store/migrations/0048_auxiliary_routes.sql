-- T17: auxiliary routes and chat titles. An agent, and its team as a default, may name
-- the models that write chat titles, fold history into summaries and describe images;
-- each is a route string checked like `model`, and an absent one falls back (agent,
-- then team, then the agent's own route). Stored as one object: `{title?, summary?,
-- vision?}`.
ALTER TABLE agents ADD COLUMN auxiliary_models jsonb NOT NULL DEFAULT '{}'::jsonb
    CHECK (jsonb_typeof(auxiliary_models) = 'object');
ALTER TABLE teams ADD COLUMN auxiliary_models jsonb NOT NULL DEFAULT '{}'::jsonb
    CHECK (jsonb_typeof(auxiliary_models) = 'object');

-- A chat's short title (a column since 0001, written only for autostart chats until
-- now): generated once after its first turn, or set by a person. Not a column a turn
-- reads, so it does not bump the chat's `basis_version`.
ALTER TABLE chats ADD CONSTRAINT chats_title_length
    CHECK (title IS NULL OR length(title) BETWEEN 1 AND 200);

-- The agent's trigger of 0038 (and of later migrations) names every column a turn reads:
-- `auxiliary_models` joins them. Rebuilt from whichever columns exist, so the list stays
-- whole whatever migration added a column before this one.
DROP TRIGGER agents_basis_version ON agents;
DO $$
DECLARE
    watched text;
BEGIN
    SELECT string_agg(quote_ident(c.column_name), ', ' ORDER BY c.ordinal_position)
    INTO watched
    FROM information_schema.columns c
    WHERE c.table_schema = current_schema() AND c.table_name = 'agents'
      AND c.column_name IN ('name', 'system_prompt', 'model', 'fallback_models',
          'runtime_profile', 'autostart_cron', 'autostart_prompt', 'autostart_timezone',
          'archived_at', 'concierge', 'approval_policy', 'disconnect_policy', 'busy_policy',
          'stream_reasoning', 'auxiliary_models');
    EXECUTE format(
        'CREATE TRIGGER agents_basis_version BEFORE UPDATE OF %s ON agents '
        'FOR EACH ROW EXECUTE FUNCTION bump_basis_version()', watched);
END
$$;
