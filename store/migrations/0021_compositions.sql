-- T3 (issue 17): a turn's frozen composition is stored once per distinct content of a
-- team, keyed by the SHA-256 of its JSON text, instead of in every turn row. Turns of
-- agents alike share one composition, so a turn's intake no longer writes (and TOAST-
-- compresses) the tool catalog each time.
CREATE TABLE compositions (
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    hash        bytea NOT NULL CHECK (length(hash) = 32),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, hash)
);

-- The turns written before: their compositions move, keyed by the hash of Postgres' own
-- text of them (which later turns' hashes, of the brain's text, need not match: only the
-- sharing is lost, not a composition).
INSERT INTO compositions (team_id, hash, body)
    SELECT DISTINCT ON (team_id, h) team_id, h, composition
    FROM (SELECT team_id, sha256(convert_to(composition::text, 'UTF8')) AS h, composition
          FROM turns) t;
ALTER TABLE turns ADD COLUMN composition_hash bytea;
UPDATE turns SET composition_hash = sha256(convert_to(composition::text, 'UTF8'));
ALTER TABLE turns ALTER COLUMN composition_hash SET NOT NULL;
-- No foreign key to compositions: its check would share-lock the one composition row
-- that every concurrent turn of agents alike points at. A composition goes only with its
-- team, and its turns with it.
ALTER TABLE turns DROP COLUMN composition;
