-- B7: an agent names the agents of its team it may delegate to. The ids are checked to be
-- the team's live agents when they are written (no foreign key can follow an array); a
-- delegate archived later answers the `delegate` tool "no such delegate".
ALTER TABLE agents ADD COLUMN delegates uuid[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(delegates) <= 20);

-- A delegated task's turn names the turn that delegated it; `children` is read through
-- this index.
ALTER TABLE turns ADD COLUMN parent_turn_id uuid;
CREATE INDEX turns_parent ON turns (team_id, parent_turn_id) WHERE parent_turn_id IS NOT NULL;

-- A turn reads `delegates` (the tool is offered when it is not empty), so it joins the
-- columns of the agent's basis-version trigger (as 0054 does).
DO $$
DECLARE
    watched text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO watched
    FROM pg_attribute a
    WHERE a.attrelid = 'agents'::regclass AND NOT a.attisdropped
      AND (a.attname = 'delegates' OR a.attnum = ANY (
          SELECT unnest(t.tgattr::int2[]) FROM pg_trigger t
          WHERE t.tgrelid = 'agents'::regclass AND t.tgname = 'agents_basis_version'));
    DROP TRIGGER agents_basis_version ON agents;
    EXECUTE format(
        'CREATE TRIGGER agents_basis_version BEFORE UPDATE OF %s ON agents '
        'FOR EACH ROW EXECUTE FUNCTION bump_basis_version()', watched);
END
$$;
