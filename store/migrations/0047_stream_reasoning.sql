-- T18: an agent may stream its model's reasoning to the client as reasoning parts; off by
-- default, and reasoning is never stored either way.
ALTER TABLE agents ADD COLUMN stream_reasoning boolean NOT NULL DEFAULT false;

-- A turn reads the column, so it joins those of the agent's basis-version trigger (0038).
-- Rebuilt from whichever of them exist, as later migrations rebuild it.
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
