import { useState, type FormEvent } from "react";
import { ApiError, explain, type Agent, type Api } from "./api";

/** The names in a comma-separated field, blanks left out. */
export function namesOf(field: string): string[] {
  return field
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
}

/** An agent's settings that change after it was made: the agents of the team it may
 * delegate to (B7) and the skills it uses (B8), saved with PATCH /v1/agents/{id}. Keyed by
 * the agent's id where it is used, so another agent's settings start from its own. */
export function AgentSettings({
  api,
  agent,
  agents,
  onSaved,
}: {
  api: Api;
  agent: Agent;
  agents: Agent[];
  onSaved: (a: Agent) => void;
}) {
  const [delegates, setDelegates] = useState<string[]>(agent.delegates);
  const [skills, setSkills] = useState(agent.skills.join(", "));
  const [said, setSaid] = useState<{ ok: boolean; text: string }>();
  const others = agents.filter((a) => a.id !== agent.id);

  async function save(e: FormEvent) {
    e.preventDefault();
    try {
      const saved = await api.updateAgent(agent.id, { delegates, skills: namesOf(skills) });
      onSaved(saved);
      setSaid({ ok: true, text: "Saved." });
    } catch (err) {
      setSaid({ ok: false, text: err instanceof ApiError ? explain(err) : "Something went wrong. Try again." });
    }
  }

  return (
    <details className="settings">
      <summary>Agent settings</summary>
      <form onSubmit={save} aria-label={`Settings of ${agent.name}`}>
        <fieldset>
          <legend>Delegates (agents it may hand tasks to)</legend>
          {others.length === 0 && <p className="hint">No other agent in the team.</p>}
          {others.map((a) => (
            <label key={a.id} className="check">
              <input
                type="checkbox"
                checked={delegates.includes(a.id)}
                onChange={(e) =>
                  setDelegates((all) => (e.target.checked ? [...all, a.id] : all.filter((id) => id !== a.id)))
                }
              />{" "}
              {a.name}
            </label>
          ))}
        </fieldset>
        <label htmlFor={`skills-${agent.id}`}>Skills (names, comma-separated)</label>
        <input id={`skills-${agent.id}`} value={skills} onChange={(e) => setSkills(e.target.value)} />
        <div className="row">
          <button type="submit">Save settings</button>
        </div>
        {said && (
          <p className={said.ok ? "status" : "error"} role={said.ok ? "status" : "alert"}>
            {said.text}
          </p>
        )}
      </form>
    </details>
  );
}
