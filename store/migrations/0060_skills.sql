-- Skills (B8): a team's Agent Skills folders, each upload of a name a new version; the
-- newest version of a name is the one agents use. The folder's files live in the artifact
-- store as one canonical tar + zstd stream under storage_key (queued in blob_garbage by
-- the trigger when the row goes); SKILL.md itself and the list of files are kept here so a
-- turn's prompt and `skill_read` read them without the archive.
CREATE TABLE skills (
    id           uuid PRIMARY KEY,
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- The Agent Skills name rule: lowercase letters, digits and single inner hyphens.
    name         text NOT NULL CHECK (name ~ '^[a-z0-9]+(-[a-z0-9]+)*$' AND octet_length(name) <= 64),
    version      integer NOT NULL CHECK (version >= 1),
    description  text NOT NULL CHECK (char_length(description) BETWEEN 1 AND 1024),
    skill_md     text NOT NULL CHECK (octet_length(skill_md) <= 262144),
    -- [{"path": "scripts/x.sh", "size": 12}, ...], SKILL.md included, sorted by path.
    files        jsonb NOT NULL,
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    storage_key  text NOT NULL UNIQUE CHECK (octet_length(storage_key) BETWEEN 1 AND 512),
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name, version)
);

CREATE TRIGGER skills_gone AFTER DELETE ON skills
    FOR EACH ROW EXECUTE FUNCTION blob_gone();
