-- An agent names the knowledge bases of its team it searches, and whether each turn's
-- prompt recalls their passages. The ids are checked against the team's bases when they are
-- written; a base deleted later simply drops out of the agent's searches (no foreign key
-- can follow an array, and none is needed: every search names the team too).
ALTER TABLE agents ADD COLUMN knowledge_bases uuid[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(knowledge_bases) <= 20);
ALTER TABLE agents ADD COLUMN knowledge_recall text NOT NULL DEFAULT 'off'
    CHECK (knowledge_recall IN ('auto', 'off'));

-- A turn reads both columns, so they join those of the agent's basis-version trigger,
-- rebuilt from the columns it watches now plus these (as 0051 does).
DO $$
DECLARE
    watched text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO watched
    FROM pg_attribute a
    WHERE a.attrelid = 'agents'::regclass AND NOT a.attisdropped
      AND (a.attname IN ('knowledge_bases', 'knowledge_recall') OR a.attnum = ANY (
          SELECT unnest(t.tgattr::int2[]) FROM pg_trigger t
          WHERE t.tgrelid = 'agents'::regclass AND t.tgname = 'agents_basis_version'));
    DROP TRIGGER agents_basis_version ON agents;
    EXECUTE format(
        'CREATE TRIGGER agents_basis_version BEFORE UPDATE OF %s ON agents '
        'FOR EACH ROW EXECUTE FUNCTION bump_basis_version()', watched);
END
$$;
