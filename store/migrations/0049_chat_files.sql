-- Files into chats (T21, T22): what a person attaches to a chat, uploaded
-- (`POST /v1/chats/{id}/files`) or sent inline as a `data:` URL in a message's file part.
-- The bytes live in the artifact store under storage_key (<team id>/<file id>, generated
-- ids only); media_type is the one sniffed from the bytes, never the client's word. A file
-- belongs to its chat and goes with it: its bytes are queued in blob_garbage by the same
-- trigger as artifacts', in the deleting transaction.

CREATE TABLE chat_files (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    chat_id      uuid NOT NULL,
    media_type   text NOT NULL CHECK (octet_length(media_type) BETWEEN 3 AND 255),
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    filename     text NOT NULL CHECK (octet_length(filename) BETWEEN 1 AND 255),
    storage_key  text NOT NULL UNIQUE CHECK (octet_length(storage_key) BETWEEN 1 AND 512),
    created_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, chat_id) REFERENCES chats (team_id, id) ON DELETE CASCADE
);
CREATE INDEX chat_files_chat ON chat_files (team_id, chat_id);

CREATE TRIGGER chat_files_gone AFTER DELETE ON chat_files
    FOR EACH ROW EXECUTE FUNCTION blob_gone();
