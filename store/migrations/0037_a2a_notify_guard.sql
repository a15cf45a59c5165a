-- Issue 31: every turn's end fired `a2a_notify`, a SQL function that Postgres plans again
-- at each call (SQL functions keep no plan across calls), so a turn without a push config
-- (nearly all) paid ~0.9 ms of backend CPU to insert nothing: about a third of Postgres'
-- CPU per turn (docs/PERFORMANCE.md, issue 31). The trigger now asks first, in PL/pgSQL,
-- whose statements keep their plans for the session: one probe of the configs' primary key.
-- The probe runs in the trigger as the notification did, on a snapshot of its own
-- (READ COMMITTED, a volatile function), so the race with a config being kept is covered
-- as before (0028).
CREATE OR REPLACE FUNCTION a2a_turn_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM a2a_push_configs c
               WHERE c.team_id = NEW.team_id AND c.turn_id = NEW.id) THEN
        PERFORM a2a_notify(NEW.team_id, NEW.id, NULL);
    END IF;
    RETURN NULL;
END
$$;
