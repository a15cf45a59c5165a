-- P1 (issue 28): a push config's `token` and `authentication` credentials are the
-- receiver's secrets; they are sealed under `BRAIN_SECRETS_KEY` (AES-256-GCM, bound to
-- team, task, config and field) as webhook signing secrets are (0027), and opened in Rust
-- when a notification is sent or the task's owner reads its configs.
--
-- The configs kept so far hold them in plain text, and SQL has no key to seal them with:
-- they are deleted (with their pending notifications, by 0028's cascade). A config lives
-- as long as its task, which is short; a client that still wants pushes sets it again.
DELETE FROM a2a_push_configs;

ALTER TABLE a2a_push_configs
    DROP COLUMN token,
    DROP COLUMN auth_credentials,
    ADD COLUMN token_nonce bytea,
    ADD COLUMN token_sealed bytea,
    ADD COLUMN credentials_nonce bytea,
    ADD COLUMN credentials_sealed bytea,
    ADD CHECK ((token_nonce IS NULL) = (token_sealed IS NULL)),
    ADD CHECK ((credentials_nonce IS NULL) = (credentials_sealed IS NULL));
