-- Knowledge bases (B3, B4): a team's documents, chunked and searched with Postgres
-- full-text search.
--
-- A document's row is also its indexing job: `queued` until a replica claims it
-- (`FOR UPDATE SKIP LOCKED`), `indexing` while the claim's lease runs, then `ready` (its
-- chunks written in the same statement) or `failed` with its reason. A claim whose lease
-- lapsed (its replica died) is claimed again; `claim` fences the writes of a replica cut
-- off from its job. The raw bytes live in the artifact store under storage_key and are
-- queued in blob_garbage by the trigger when the row goes.

CREATE TABLE knowledge_bases (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name         text NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 200),
    description  text NOT NULL DEFAULT '' CHECK (octet_length(description) <= 2000),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id)
);
CREATE INDEX knowledge_bases_team ON knowledge_bases (team_id, created_at, id);

CREATE TABLE knowledge_documents (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL,
    base_id      uuid NOT NULL,
    filename     text NOT NULL CHECK (octet_length(filename) BETWEEN 1 AND 255),
    media_type   text NOT NULL CHECK (octet_length(media_type) BETWEEN 3 AND 255),
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    storage_key  text NOT NULL UNIQUE CHECK (octet_length(storage_key) BETWEEN 1 AND 512),
    title        text CHECK (octet_length(title) <= 500),
    status       text NOT NULL DEFAULT 'queued'
                 CHECK (status IN ('queued', 'indexing', 'ready', 'failed')),
    error        text CHECK (octet_length(error) <= 1000),
    chunks       integer NOT NULL DEFAULT 0 CHECK (chunks >= 0),
    attempts     integer NOT NULL DEFAULT 0,
    claim        uuid,
    lease_until  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    indexed_at   timestamptz,
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, base_id) REFERENCES knowledge_bases (team_id, id) ON DELETE CASCADE
);
CREATE INDEX knowledge_documents_base ON knowledge_documents (team_id, base_id, created_at, id);
-- What the indexers look for: the jobs not yet done, by when they may be claimed.
CREATE INDEX knowledge_documents_due ON knowledge_documents (lease_until, created_at)
    WHERE status IN ('queued', 'indexing');

CREATE TRIGGER knowledge_documents_gone AFTER DELETE ON knowledge_documents
    FOR EACH ROW EXECUTE FUNCTION blob_gone();

-- A passage of a document: its heading path, its place in the document and its text. The
-- heading weighs more than the body in the ranking (weight A against B).
CREATE TABLE knowledge_chunks (
    team_id      uuid NOT NULL,
    base_id      uuid NOT NULL,
    document_id  uuid NOT NULL,
    position     integer NOT NULL CHECK (position >= 0),
    heading      text NOT NULL DEFAULT '',
    body         text NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (
                     setweight(to_tsvector('english', heading), 'A')
                     || setweight(to_tsvector('english', body), 'B')) STORED,
    PRIMARY KEY (document_id, position),
    FOREIGN KEY (team_id, document_id) REFERENCES knowledge_documents (team_id, id)
        ON DELETE CASCADE
);
CREATE INDEX knowledge_chunks_tsv ON knowledge_chunks USING gin (tsv);
CREATE INDEX knowledge_chunks_base ON knowledge_chunks (team_id, base_id);
