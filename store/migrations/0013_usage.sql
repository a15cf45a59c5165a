-- E1: worker-seconds billing. A session's billed lifetime runs from `billing_from`, when
-- its worker was launched (`provisioning → connecting`, the row gets its `worker_ref`) or
-- claimed from a warm pool (the row is inserted with the slot's `worker_ref`), to
-- `ended_at`, its move into `terminated` or `failed`, whichever process wrote it and
-- however it ended (idle teardown, a failure, a lost heartbeat, a manager's shutdown or
-- its crash recovery). A session that never had a worker is never billed.
--
-- The runtime-manager's billing sweep (every replica, every reaper interval) writes one
-- `worker_seconds` event per full interval of a live session and, once it has ended, one
-- `final` event for the rest; `billed_until` is how far the events reach, advanced in the
-- same statement that writes them, with the row locked, so a sweep that fails writes
-- nothing and two sweeps never bill one interval (the event_key is the backstop).
ALTER TABLE agent_runtime_sessions
    ADD COLUMN billing_from timestamptz,
    ADD COLUMN ended_at     timestamptz,
    ADD COLUMN billed_until timestamptz;

-- Sessions that ended before billing existed are not billed; the live ones with a worker
-- are billed from now on.
UPDATE agent_runtime_sessions SET ended_at = updated_at WHERE state IN ('terminated', 'failed');
UPDATE agent_runtime_sessions SET billing_from = now()
    WHERE worker_ref IS NOT NULL AND state NOT IN ('terminated', 'failed');

-- Both times are set by the schema rather than by each statement, so no transition (of the
-- brain, the manager, or one added later) can forget them. `clock_timestamp()`, not
-- `now()`: a BEFORE ROW trigger runs once the row is locked, so an end that waited for a
-- billing sweep holding the row is later than every interval that sweep billed.
CREATE FUNCTION session_billing_times() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.worker_ref IS NOT NULL AND NEW.billing_from IS NULL THEN
        NEW.billing_from := clock_timestamp();
    END IF;
    IF NEW.state IN ('terminated', 'failed') AND NEW.ended_at IS NULL THEN
        NEW.ended_at := clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER session_billing_times
    BEFORE INSERT OR UPDATE OF worker_ref, state ON agent_runtime_sessions
    FOR EACH ROW EXECUTE FUNCTION session_billing_times();

-- What the sweep reads: sessions with a worker whose events do not yet reach their end.
CREATE INDEX sessions_billing_open ON agent_runtime_sessions (billing_from)
    WHERE billing_from IS NOT NULL
      AND (ended_at IS NULL OR billed_until IS NULL OR billed_until < ended_at);

