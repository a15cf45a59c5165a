import { useEffect, useState } from "react";
import { ApiError, type Api, type Memory } from "./api";

/** What the agent remembers about the person signed in (M4), each with a way to delete it.
 * Read when opened, so a closed panel costs no request. */
export function MemoriesPanel({ api, agentId }: { api: Api; agentId: string }) {
  const [open, setOpen] = useState(false);
  const [memories, setMemories] = useState<Memory[]>();
  const [problem, setProblem] = useState<string>();

  useEffect(() => {
    if (!open) return;
    setMemories(undefined);
    setProblem(undefined);
    api.memories(agentId).then(setMemories, (e) => setProblem(e instanceof ApiError ? e.message : String(e)));
  }, [api, agentId, open]);

  async function forget(id: string) {
    try {
      await api.deleteMemory(id);
      setMemories((all) => all?.filter((m) => m.id !== id));
    } catch (e) {
      setProblem(e instanceof ApiError ? e.message : String(e));
    }
  }

  return (
    <details className="memories" onToggle={(e) => setOpen((e.target as HTMLDetailsElement).open)}>
      <summary>What the agent remembers about you</summary>
      {problem && (
        <p className="error" role="alert">
          {problem}
        </p>
      )}
      {memories === undefined && !problem && <p>Loading…</p>}
      {memories?.length === 0 && <p>Nothing yet.</p>}
      <ul className="list">
        {memories?.map((m) => (
          <li key={m.id}>
            <span>{m.content}</span>
            <button
              type="button"
              className="delete"
              aria-label="Delete memory"
              title="The agent forgets this"
              onClick={() => forget(m.id)}
            >
              Delete
            </button>
          </li>
        ))}
      </ul>
    </details>
  );
}
