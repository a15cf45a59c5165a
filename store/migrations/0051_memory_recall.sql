-- M3: each turn's prompt recalls the agent's memories in its scope unless the agent turns
-- it off.
ALTER TABLE agents ADD COLUMN memory_recall text NOT NULL DEFAULT 'auto'
    CHECK (memory_recall IN ('auto', 'off'));

-- A turn reads the column, so it joins those of the agent's basis-version trigger (0038).
-- Rebuilt from the columns the trigger watches now plus this one, so a column another
-- migration added to it stays watched whatever order they ran in.
DO $$
DECLARE
    watched text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
    INTO watched
    FROM pg_attribute a
    WHERE a.attrelid = 'agents'::regclass AND NOT a.attisdropped
      AND (a.attname = 'memory_recall' OR a.attnum = ANY (
          SELECT unnest(t.tgattr::int2[]) FROM pg_trigger t
          WHERE t.tgrelid = 'agents'::regclass AND t.tgname = 'agents_basis_version'));
    DROP TRIGGER agents_basis_version ON agents;
    EXECUTE format(
        'CREATE TRIGGER agents_basis_version BEFORE UPDATE OF %s ON agents '
        'FOR EACH ROW EXECUTE FUNCTION bump_basis_version()', watched);
END
$$;

-- M5: past chats are found by the text of their messages. The expression is the text
-- parts only (never tool inputs or outputs), and the chat search query repeats it
-- verbatim so the planner can use the index. A GIN index keeps a pending list (its
-- default `fastupdate`), so a message insert appends to it rather than updating the tree.
--
-- Built here only while the table is small: building it takes a lock that holds message
-- writes back for the build's length, which on a large table is minutes. A larger
-- deployment builds it without that lock (`CREATE INDEX CONCURRENTLY`, the statement in
-- docs/OPERATIONS.md); until then the search reads the caller's chats' messages without it.
DO $$
BEGIN
    IF (SELECT reltuples FROM pg_class WHERE oid = 'messages'::regclass) < 200000 THEN
        CREATE INDEX IF NOT EXISTS messages_search ON messages USING gin (
            to_tsvector('simple'::regconfig,
                        jsonb_path_query_array(parts, '$[*] ? (@.type == "text").text')));
    ELSE
        RAISE NOTICE 'messages_search not built: build it with CREATE INDEX CONCURRENTLY';
    END IF;
END
$$;
