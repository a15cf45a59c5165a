-- W7 (issue 10): the idle timer of a worker session is the runtime-manager's, counted from
-- `ready`. `idle_check_at` is when the session's pending IdleCheck task is due (database
-- clock), written before the task is pushed; NULL while none was armed. The reaper arms
-- the first check of every ready session that has none, and a new one for a session whose
-- check is overdue by more than its grace (the push failed, the manager died between the
-- two, Redis restarted), so no session escapes its teardown.
ALTER TABLE agent_runtime_sessions ADD COLUMN idle_check_at timestamptz;
CREATE INDEX sessions_idle_check ON agent_runtime_sessions (idle_check_at) WHERE state = 'ready';

-- The reaper arms every ready session's idle timer, claimed warm-pool sessions included:
-- the slot's `armed` flag has no reader left.
ALTER TABLE worker_pool DROP COLUMN armed;

-- O3: the runtime-manager replica that claimed the session's provision (`pending →
-- provisioning`). A re-delivered Provision task takes a `provisioning` row with no worker
-- over only from a replica whose lease (`replicas`) has lapsed, so two live managers never
-- launch workers for one session.
ALTER TABLE agent_runtime_sessions ADD COLUMN manager_replica uuid;
