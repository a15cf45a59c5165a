// B7 in the page: a `delegate` call's task runs as a turn of another agent, whose progress
// streams as transient `data-delegation` parts tagged with the call. They are folded here
// into one record per call and shown as a card nested in the delegate tool's card. Being
// transient, they live in this tab only: after a reload the call shows its result alone.

/** One `data-delegation` part's payload, as protocol::ui::Delegation writes it. */
interface DelegationData {
  toolCallId: string;
  turnId: string;
  chatId: string;
  agentId: string;
  event:
    | { kind: "started" }
    | { kind: "text"; delta: string }
    | { kind: "tool-call"; toolCallId: string; toolName: string }
    | { kind: "tool-result"; toolCallId: string; error: boolean }
    | { kind: "finished"; status: string };
}

/** A delegate's tool call as its card shows it. */
interface ChildTool {
  id: string;
  name: string;
  state: "running" | "done" | "failed";
}

/** What a delegated task did so far. */
export interface Progress {
  agentId: string;
  turnId: string;
  text: string;
  tools: ChildTool[];
  /** `running` until the task's `finished` event: then `completed`, `failed` or `interrupted`. */
  status: string;
}

export type Delegations = Record<string, Progress>;

/** `all` with the `data-delegation` part `part` folded in; `all` itself for any other part. */
export function foldDelegation(all: Delegations, part: { type: string; data?: unknown }): Delegations {
  if (part.type !== "data-delegation") return all;
  const d = part.data as DelegationData;
  const was = all[d.toolCallId] ?? { agentId: d.agentId, turnId: d.turnId, text: "", tools: [], status: "running" };
  const e = d.event;
  let next: Progress = was;
  if (e.kind === "text") next = { ...was, text: was.text + e.delta };
  else if (e.kind === "tool-call")
    next = { ...was, tools: [...was.tools, { id: e.toolCallId, name: e.toolName, state: "running" }] };
  else if (e.kind === "tool-result")
    next = {
      ...was,
      tools: was.tools.map((t) => (t.id === e.toolCallId ? { ...t, state: e.error ? "failed" : "done" } : t)),
    };
  else if (e.kind === "finished") next = { ...was, status: e.status };
  return { ...all, [d.toolCallId]: next };
}

const STATUS: Record<string, string> = {
  running: "working…",
  completed: "finished",
  failed: "failed",
  interrupted: "interrupted",
};

/** The nested card of one delegated task: who works on it, what it writes and calls, how
 * it ended. `name` is the delegate's name (or the id the model used, when the page does
 * not know the agent). */
export function DelegationCard({ name, progress }: { name: string; progress: Progress }) {
  return (
    <section className={`delegation ${progress.status}`} aria-label={`Delegated to ${name}`}>
      <p className="delegation-head">
        <span className="delegation-agent">{name}</span>{" "}
        <span className="delegation-status" role="status">
          {STATUS[progress.status] ?? progress.status}
        </span>
      </p>
      {progress.tools.length > 0 && (
        <ul className="delegation-tools">
          {progress.tools.map((t) => (
            <li key={t.id} className={t.state}>
              <span className="tool-name">{t.name}</span> <span className="tool-state">{t.state}</span>
            </li>
          ))}
        </ul>
      )}
      {progress.text && <p className="delegation-text">{progress.text}</p>}
    </section>
  );
}
