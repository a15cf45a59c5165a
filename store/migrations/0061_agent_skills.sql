-- An agent names the skills of its team it uses (B8), by name: the newest version of each
-- is the one its turns see. Names are checked against the team's skills when written; a
-- skill deleted later simply drops out of the agent's prompt (no foreign key follows an
-- array).
ALTER TABLE agents ADD COLUMN skills text[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(skills) <= 20);

-- A turn reads the column, so it joins those of the agent's basis-version trigger (as
-- 0054 does).
DO $$
DECLARE
    watched text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO watched
    FROM pg_attribute a
    WHERE a.attrelid = 'agents'::regclass AND NOT a.attisdropped
      AND (a.attname = 'skills' OR a.attnum = ANY (
          SELECT unnest(t.tgattr::int2[]) FROM pg_trigger t
          WHERE t.tgrelid = 'agents'::regclass AND t.tgname = 'agents_basis_version'));
    DROP TRIGGER agents_basis_version ON agents;
    EXECUTE format(
        'CREATE TRIGGER agents_basis_version BEFORE UPDATE OF %s ON agents '
        'FOR EACH ROW EXECUTE FUNCTION bump_basis_version()', watched);
END
$$;
