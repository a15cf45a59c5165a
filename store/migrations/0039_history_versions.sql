-- Issue 31: a replica keeps each chat's unsummarized history with its basis (0038), and
-- the next intake reads only the messages written after it. Messages are appended; a
-- change or a deletion of one (an approval's answer written into its parts, a queued
-- message started or withdrawn, a failed turn's message taken back, retention, erasure)
-- bumps its chat's basis_version, so the kept history is found stale like the basis.
-- Row-level: a statement that touches no message (the wrap-up's withdrawal, on nearly
-- every turn) costs nothing; one that deletes many (retention) bumps each chat per row.
CREATE FUNCTION bump_chat_basis_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE chats SET basis_version = basis_version + 1
    WHERE team_id = OLD.team_id AND id = OLD.chat_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_basis_version
    AFTER UPDATE OR DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION bump_chat_basis_version();
