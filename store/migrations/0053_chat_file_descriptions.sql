-- Images described for a model without vision (T27): the description the vision route
-- wrote, kept so later turns do not ask again. description_attempts and
-- description_tried_at bound the asking: a turn claims a file by raising the attempts
-- (a conditional update, so two turns at once do not both pay for it); a claim older
-- than the describe bound may be taken again, and past a few attempts the file is no
-- longer asked about.

ALTER TABLE chat_files
    ADD COLUMN description text CHECK (octet_length(description) BETWEEN 1 AND 16384),
    ADD COLUMN description_attempts smallint NOT NULL DEFAULT 0,
    ADD COLUMN description_tried_at timestamptz;
