-- R3: warm pools. A slot is a pre-started worker that dialed in unassigned, with a pool
-- token; it belongs to no team until a session claims it (then `session_id` is set and
-- the session row carries the worker's reference). Slots are not tenant data, so this is
-- the one table without team_id.
CREATE TABLE worker_pool (
    id          uuid PRIMARY KEY,
    profile     text NOT NULL,
    state       text NOT NULL CHECK (state IN ('starting', 'idle', 'claimed', 'gone')),
    worker_ref  text,
    session_id  uuid,
    -- The runtime-manager armed the claimed session's idle timer.
    armed       boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX worker_pool_idle ON worker_pool (profile, created_at) WHERE state = 'idle';
CREATE INDEX worker_pool_open ON worker_pool (profile) WHERE state IN ('starting', 'idle');
