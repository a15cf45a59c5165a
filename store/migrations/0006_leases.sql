-- O3: every brain and runtime-manager process is a replica with a lease it renews every
-- few seconds. A turn records the brain replica running it and a worker session the brain
-- replica holding its socket, so the survivors can reconcile what a dead replica left:
-- a running turn whose replica's lease lapsed is ended `interrupted` (`replica_lost`).
CREATE TABLE replicas (
    id           uuid PRIMARY KEY,
    kind         text NOT NULL CHECK (kind IN ('brain', 'runtime-manager')),
    started_at   timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz NOT NULL
);
CREATE INDEX replicas_lease ON replicas (lease_until);

-- Turns written before leases existed have no replica (NULL): nothing reconciles them.
ALTER TABLE turns ADD COLUMN replica_id uuid;
CREATE INDEX turns_running_replica ON turns (replica_id) WHERE status = 'running';

-- The brain replica holding the session's worker socket (NULL while none does).
ALTER TABLE agent_runtime_sessions ADD COLUMN owner_replica uuid;
