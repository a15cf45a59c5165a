-- Keys every brain replica shares and no operator sets (T26): the key that signs the
-- download URLs of chat files when BRAIN_SECRETS_KEY is not set. The first replica that
-- needs a key writes a random one; a replica that loses the race reads the winner's.
-- Deleting a row changes the key: URLs signed under the old one are refused.

CREATE TABLE server_keys (
    name        text PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 64),
    key         bytea NOT NULL CHECK (octet_length(key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
