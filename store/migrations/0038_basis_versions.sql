-- Issue 31: each replica keeps the chats and agents its turns start from (brain
-- src/turn/basis.rs), and the intake's one statement checks that what it kept is current
-- before it writes the turn. A version per row is what it checks: bumped by the rows'
-- own update, so no writer can forget it. Only the columns a turn reads bump it: the
-- scheduler's `autostart_next_fire_at`, written at each fire, does not make every
-- autostart agent's cached row stale.
ALTER TABLE agents ADD COLUMN basis_version bigint NOT NULL DEFAULT 0;
ALTER TABLE chats ADD COLUMN basis_version bigint NOT NULL DEFAULT 0;

CREATE FUNCTION bump_basis_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.basis_version := OLD.basis_version + 1;
    RETURN NEW;
END
$$;

-- Every column of `AGENT_COLUMNS` (brain src/store/agents.rs) a user can change.
CREATE TRIGGER agents_basis_version
    BEFORE UPDATE OF name, system_prompt, model, fallback_models, runtime_profile,
        autostart_cron, autostart_prompt, autostart_timezone, archived_at, concierge,
        approval_policy, disconnect_policy, busy_policy
    ON agents FOR EACH ROW EXECUTE FUNCTION bump_basis_version();

-- Every column of `CHAT_COLUMNS` (brain src/store/chats.rs) that changes after insert.
CREATE TRIGGER chats_basis_version
    BEFORE UPDATE OF agent_id, summary, summary_through, created_by
    ON chats FOR EACH ROW EXECUTE FUNCTION bump_basis_version();
