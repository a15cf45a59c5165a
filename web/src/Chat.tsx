// One chat: `useChat` from @ai-sdk/react over the brain's own stream, unchanged. The
// transcript comes from GET /v1/chats/{id}/messages; new turns stream from POST to the
// same path; a turn already running when the chat opens is resumed from its start
// (`resume`, GET /v1/chats/{id}/stream), and so is one whose stream broke mid-turn (its
// replica died and another took the turn over, D5). While a turn runs, a message may still
// be typed: "Queue" stores it to run after the turn (T13, `if_busy: enqueue`), "Stop and
// send" interrupts the turn and streams the new one (`if_busy: interrupt`).

import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  type UIMessage,
} from "ai";
import { useEffect, useMemo, useRef, useState, type FormEvent } from "react";
import { type Agent, type Api, ApiError, explain, parseError } from "./api";
import { Markdown } from "./markdown";
import { Artifact, artifactIds } from "./artifact";
import { FilePart, PendingFiles, useAttachments } from "./attachments";
import { follow } from "./follow";
import { DelegationCard, type Delegations, foldDelegation, type Progress } from "./delegation";

type LogLine = { stream: string; text: string };

interface Props {
  api: Api;
  /** The team's agents, to name a delegated task's agent. */
  agents: Agent[];
  chatId: string;
  initial: UIMessage[];
  /** Stored status of each message id (`complete`, `interrupted`, `queued`, `withdrawn`). */
  statuses: Record<string, string>;
  /** Reloads the transcript from the store (after a stop, or when a turn ends). */
  reload: () => Promise<UIMessage[]>;
  /** Each stored message's turn, for withdrawing a queued one. */
  turns: Record<string, string>;
}

export function ChatView({ api, agents, chatId, initial, statuses, reload, turns }: Props) {
  const [logs, setLogs] = useState<Record<string, LogLine[]>>({});
  const [delegations, setDelegations] = useState<Delegations>({});
  const [stopping, setStopping] = useState(false);
  const [input, setInput] = useState("");
  const attachments = useAttachments(api, chatId);
  const fileInput = useRef<HTMLInputElement>(null);
  const [dragging, setDragging] = useState(false);
  // This tab's own turns, which its POST streams: the events stream skips them.
  const own = useRef(new Set<string>());
  const [queueError, setQueueError] = useState<ApiError | undefined>();
  // Messages this tab queued, until the stored transcript has them: status and turn.
  const [queued, setQueued] = useState<Record<string, string>>({});
  // Their turns run after this tab's: the events stream brings them even while it streams.
  const queuedTurns = useRef(new Set<string>());
  const [withdrawn, setWithdrawn] = useState<Record<string, boolean>>({});
  const statusOf = (id: string) =>
    withdrawn[id] ? "withdrawn" : (statuses[id] ?? (queued[id] ? "queued" : ""));

  const transport = useMemo(
    () =>
      new DefaultChatTransport({
        api: `/v1/chats/${chatId}/messages`,
        headers: api.authHeaders,
        // The brain builds the model's history from its own store and reads only the last
        // message, so the page sends just that one.
        prepareSendMessagesRequest: ({ id, messages, trigger, messageId, body }) => ({
          body: { ...body, id, messages: messages.slice(-1), trigger, messageId },
        }),
        prepareReconnectToStreamRequest: () => ({
          api: `/v1/chats/${chatId}/stream`,
          headers: api.authHeaders,
        }),
      }),
    [api, chatId],
  );
  // Transient parts: a worker's live output, and a delegated task's progress (B7).
  const onLog = (part: { type: string; data?: unknown }) => {
    if (part.type === "data-delegation") setDelegations((all) => foldDelegation(all, part));
    if (part.type !== "data-worker-log") return;
    const d = part.data as { toolCallId: string; stream: string; text: string };
    setLogs((all) => ({
      ...all,
      [d.toolCallId]: [...(all[d.toolCallId] ?? []), { stream: d.stream, text: d.text }],
    }));
  };
  const {
    messages,
    sendMessage,
    status,
    error,
    stop,
    setMessages,
    addToolApprovalResponse,
    clearError,
    resumeStream,
  } =
    useChat({
      id: chatId,
      messages: initial,
      transport,
      // A turn that runs as the chat opens (another tab's, an autostart) streams in from
      // its start, like this tab's own would.
      resume: true,
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onData: (part) => {
        if (part.type === "data-turn") own.current.add((part.data as { turnId: string }).turnId);
        onLog(part);
      },
      onFinish: ({ isAbort, isDisconnect }) => {
        // The connection broke (its replica died): the turn goes on elsewhere (D3), so the
        // page follows it again instead of waiting for a reload (D5).
        if (isDisconnect) {
          void followAgain();
          return;
        }
        // The stored transcript is the truth (statuses, the turn's final parts).
        if (!isAbort) void reload().then((stored) => setMessages((live) => keepLiveStatus(stored, live)));
      },
    });
  const statusRef = useRef(status);
  statusRef.current = status;
  const resumeRef = useRef(resumeStream);
  resumeRef.current = resumeStream;
  // GET /v1/chats/{id}/stream from its start: the AI SDK rebuilds the message from the
  // replayed `start` (a taken-over turn's stream is its durable steps, then the rest), or
  // finds nothing to resume (204: the turn ended). A refused connection (no replica took
  // the request yet) is tried again for a while; the transcript then says how it ended.
  async function followAgain() {
    for (let attempt = 0; attempt < 10; attempt++) {
      await new Promise((r) => setTimeout(r, attempt === 0 ? 200 : 1000));
      await resumeRef.current();
      await new Promise((r) => setTimeout(r, 0));
      if (statusRef.current !== "error") break;
    }
    const stored = await reloadRef.current();
    setMessagesRef.current((live) => keepLiveStatus(stored, live));
  }
  const busy = status === "submitted" || status === "streaming";
  const busyRef = useRef(busy);
  busyRef.current = busy;
  const reloadRef = useRef(reload);
  reloadRef.current = reload;
  const setMessagesRef = useRef(setMessages);
  setMessagesRef.current = setMessages;
  const onLogRef = useRef(onLog);
  onLogRef.current = onLog;

  // Turns started elsewhere (another tab, autostart) stream in through the events stream.
  useEffect(
    () =>
      follow(api, chatId, {
        isOwn: (turnId) =>
          !queuedTurns.current.has(turnId) && (busyRef.current || own.current.has(turnId)),
        onMessage: (message) =>
          setMessagesRef.current((all) =>
            all.some((m) => m.id === message.id)
              ? all.map((m) => (m.id === message.id ? message : m))
              : [...all, message],
          ),
        onData: (part) => onLogRef.current(part),
        onTurnEnd: () => {
          if (!busyRef.current)
            void reloadRef.current().then((stored) => setMessagesRef.current((live) => keepLiveStatus(stored, live)));
        },
      }),
    [api, chatId],
  );
  const list = useRef<HTMLOListElement>(null);
  useEffect(() => {
    if (list.current) list.current.scrollTop = list.current.scrollHeight;
  }, [messages, logs]);

  async function onStop() {
    setStopping(true);
    // Aborting the request stops the turn; the explicit stop also reaches a turn this tab
    // is not attached to (another tab, another replica).
    await stop();
    try {
      await api.stopChat(chatId);
    } catch {
      // The abort alone stops the turn; the stored state below says what happened.
    }
    // The turn is stored as interrupted milliseconds after the stop.
    for (let i = 0; i < 20; i++) {
      const loaded = await reload();
      const last = loaded[loaded.length - 1];
      if (last?.role === "assistant") {
        setMessages((live) => keepLiveStatus(loaded, live));
        break;
      }
      await new Promise((r) => setTimeout(r, 150));
    }
    setStopping(false);
  }

  function onSubmit(e: FormEvent) {
    e.preventDefault();
    const text = input.trim();
    if (busy) {
      if (text && !attachments.ready) void onQueue();
      return;
    }
    if ((!text && !attachments.ready) || attachments.uploading) return;
    clearError();
    setQueueError(undefined);
    setInput("");
    // Refused files are left out: only what the brain stored is sent.
    const files = attachments.take();
    void sendMessage(text ? { text, files } : { files });
  }
  const canSend = (!!input.trim() || attachments.ready) && !attachments.uploading;

  /** T13: the message waits its turn; it shows as queued, then runs (the events stream
   * brings its answer). */
  async function onQueue() {
    const text = input.trim();
    if (!text) return;
    setInput("");
    setQueueError(undefined);
    let accepted: { turn_id: string; message_id: string; status: string };
    try {
      accepted = await api.enqueue(chatId, text);
    } catch (err) {
      setQueueError(err as ApiError);
      setInput(text);
      return;
    }
    if (accepted.status !== "queued") return; // The agent was free: the events stream shows it.
    queuedTurns.current.add(accepted.turn_id);
    setQueued((all) => ({ ...all, [accepted.message_id]: accepted.turn_id }));
    // After the running turn's message: its stream updates that one by id.
    setMessages((all) => [
      ...all,
      { id: accepted.message_id, role: "user", parts: [{ type: "text", text }] } as UIMessage,
    ]);
  }

  /** T13: the running turn is stopped (its partial answer kept) and this message's turn
   * runs next; the events stream shows it here. */
  async function onInterrupt() {
    const text = input.trim();
    if (!text) return;
    setInput("");
    setQueueError(undefined);
    // One request stops the running turn and starts this one. Ending this tab's stream
    // first would stop the turn on its own (the client left) and free the agent for a
    // queued message, which would then run before this one.
    try {
      await api.interrupt(chatId, text);
    } catch (err) {
      setQueueError(err as ApiError);
      setInput(text);
    }
  }

  async function onWithdraw(messageId: string) {
    const turn = turns[messageId] ?? queued[messageId];
    if (!turn) return;
    try {
      await api.stopTurn(turn);
    } catch (err) {
      setQueueError(err as ApiError);
      return;
    }
    // The transcript keeps it, marked withdrawn; this tab's turn, if any, goes on.
    if (!busy) {
      const stored = await reload();
      setMessages((live) => keepLiveStatus(stored, live));
    } else {
      setQueued((all) => Object.fromEntries(Object.entries(all).filter(([id]) => id !== messageId)));
      setWithdrawn((all) => ({ ...all, [messageId]: true }));
    }
  }

  const problem: ApiError | undefined = queueError ?? (error ? parseError(error.message) : undefined);

  return (
    <section
      className={dragging ? "chat dragging" : "chat"}
      aria-label="Chat"
      onDragOver={(e) => {
        if (!e.dataTransfer.types.includes("Files")) return;
        e.preventDefault();
        setDragging(true);
      }}
      onDragLeave={(e) => {
        if (e.currentTarget === e.target) setDragging(false);
      }}
      onDrop={(e) => {
        if (e.dataTransfer.files.length === 0) return;
        e.preventDefault();
        setDragging(false);
        attachments.add(e.dataTransfer.files);
      }}
    >
      <ol className="messages" aria-live="polite" ref={list}>
        {messages.map((m) => (
          <li key={m.id} className={`message ${m.role}`} data-status={statusOf(m.id)}>
            <span className="who">{m.role === "user" ? "You" : "Agent"}</span>
            {m.parts.map((part, i) => (
              <Part
                key={i}
                api={api}
                part={part as AnyPart}
                logs={logs}
                delegations={delegations}
                agents={agents}
                onApprove={(id, approved) => addToolApprovalResponse({ id, approved })}
              />
            ))}
            {statusOf(m.id) === "interrupted" && (
              <p className="interrupted" role="status">
                Interrupted: the turn was stopped before it finished.
              </p>
            )}
            {statusOf(m.id) === "queued" && (
              <p className="queued" role="status">
                Queued: it runs when the agent is free.{" "}
                <button type="button" className="link" onClick={() => void onWithdraw(m.id)}>
                  Withdraw
                </button>
              </p>
            )}
            {statusOf(m.id) === "withdrawn" && (
              <p className="withdrawn" role="status">
                Withdrawn: never sent to the agent.
              </p>
            )}
          </li>
        ))}
        {status === "submitted" && (
          <li className="message assistant pending" role="status">
            Thinking…
          </li>
        )}
      </ol>
      {problem && (
        <div className="error" role="alert">
          <strong>{problem.code === "unknown" ? "Error" : problem.code}</strong>: {explain(problem)}
        </div>
      )}
      <PendingFiles items={attachments.items} onRemove={attachments.remove} />
      <form className="composer" onSubmit={onSubmit}>
        <label htmlFor="composer-input" className="visually-hidden">
          Message
        </label>
        <input
          ref={fileInput}
          id="composer-files"
          type="file"
          multiple
          className="visually-hidden"
          aria-label="Attach files"
          tabIndex={-1}
          onChange={(e) => {
            if (e.target.files) attachments.add(e.target.files);
            e.target.value = "";
          }}
        />
        <button type="button" className="attach" onClick={() => fileInput.current?.click()} title="Attach files (or drop or paste them)">
          Attach
        </button>
        <textarea
          id="composer-input"
          value={input}
          rows={2}
          placeholder="Message the agent…"
          onChange={(e) => setInput(e.target.value)}
          onPaste={(e) => {
            if (e.clipboardData.files.length === 0) return;
            e.preventDefault();
            attachments.add(e.clipboardData.files);
          }}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey) onSubmit(e);
          }}
        />
        {busy ? (
          <>
            {/* Queued and interrupting messages are text only: files wait for Send. */}
            <button type="submit" className="queue" disabled={!input.trim() || attachments.ready}>
              Queue
            </button>
            <button
              type="button"
              className="interrupt"
              onClick={() => void onInterrupt()}
              disabled={!input.trim() || attachments.ready}
            >
              Stop and send
            </button>
            <button type="button" className="stop" onClick={onStop} disabled={stopping}>
              Stop
            </button>
          </>
        ) : (
          <button type="submit" disabled={!canSend}>
            Send
          </button>
        )}
      </form>
    </section>
  );
}

/** The status lines of a turn (worker, connectors, notices) are parts of its stream only:
 * the stored transcript keeps its text, tool calls and results. When the transcript is
 * reloaded at a turn's end, the lines this page saw stay in front of that message. */
const LIVE_ONLY = new Set(["data-worker-status", "data-connector-status", "data-notice", "data-elicitation"]);

function keepLiveStatus(stored: UIMessage[], live: UIMessage[]): UIMessage[] {
  const seen = new Map(live.map((m) => [m.id, m]));
  return stored.map((m) => {
    const lines = seen.get(m.id)?.parts.filter((p) => LIVE_ONLY.has(p.type)) ?? [];
    return lines.length ? { ...m, parts: [...lines, ...m.parts.filter((p) => !LIVE_ONLY.has(p.type))] } : m;
  });
}

type AnyPart = {
  type: string;
  text?: string;
  data?: Record<string, unknown>;
  toolName?: string;
  toolCallId?: string;
  state?: string;
  input?: unknown;
  output?: unknown;
  errorText?: string;
  approval?: { id: string; approved?: boolean; reason?: string };
  url?: string;
  mediaType?: string;
  filename?: string;
  sourceId?: string;
  title?: string;
};

function Part({
  api,
  part,
  logs,
  delegations,
  agents,
  onApprove,
}: {
  api: Api;
  part: AnyPart;
  logs: Record<string, LogLine[]>;
  delegations: Delegations;
  agents: Agent[];
  onApprove: (id: string, approved: boolean) => void;
}) {
  if (part.type === "text") return <Markdown text={part.text ?? ""} />;
  if (part.type === "file") return <FilePart url={part.url} mediaType={part.mediaType} filename={part.filename} />;
  // B5: a passage of the agent's knowledge bases the answer drew on.
  if (part.type === "source-document") {
    return (
      <div className="source" title={part.sourceId}>
        Source: {part.title}
        {part.filename && part.filename !== part.title ? ` (${part.filename})` : ""}
      </div>
    );
  }
  if (part.type === "data-worker-status") {
    const d = part.data as { state: string; reason?: string };
    return (
      <p className="status">
        Worker: {d.state}
        {d.reason ? ` (${d.reason})` : ""}
      </p>
    );
  }
  if (part.type === "data-notice") {
    const d = part.data as { code: string; message: string };
    return (
      <p className="notice">
        Notice ({d.code}): {d.message}
      </p>
    );
  }
  if (part.type === "data-connector-status") return <ConnectorStatus api={api} data={part.data ?? {}} />;
  if (part.type === "data-elicitation") return <ElicitationForm api={api} data={part.data as unknown as Elicitation} />;
  if (part.type.startsWith("tool-") || part.type === "dynamic-tool") {
    const progress = delegations[part.toolCallId ?? ""];
    const delegate = progress && {
      progress,
      name:
        agents.find((a) => a.id === progress.agentId)?.name ??
        (part.input as { agent?: string } | undefined)?.agent ??
        progress.agentId,
    };
    return (
      <ToolCard
        api={api}
        part={part}
        logs={logs[part.toolCallId ?? ""] ?? []}
        delegate={delegate}
        onApprove={onApprove}
      />
    );
  }
  return null;
}

function ConnectorStatus({ api, data }: { api: Api; data: Record<string, unknown> }) {
  const [problem, setProblem] = useState<string | null>(null);
  const name = String(data.name ?? "");
  const state = String(data.state ?? "");
  const auth = data.authorize;
  const link = typeof auth === "string" ? auth : undefined;
  // The link is a flow of this origin's brain: it answers only this principal, and binds
  // the flow to this browser (the callback refuses any other).
  const flow = link && link.startsWith(`${window.location.origin}/v1/oauth/flows/`) ? link : undefined;
  const authorize = async () => {
    if (!flow) return;
    // Opened now, while the click counts as the person's, so no popup blocker stops it.
    const tab = window.open("", "_blank");
    try {
      const url = await api.continueAuthorization(flow);
      if (!/^https?:\/\//i.test(url)) throw new ApiError("invalid", "not an http(s) URL");
      if (tab) {
        tab.opener = null;
        tab.location.href = url;
      } else {
        window.location.assign(url);
      }
    } catch (e) {
      tab?.close();
      setProblem(e instanceof ApiError ? explain(e) : String(e));
    }
  };
  if (state === "needs_authorization") {
    return (
      <p className="status connector">
        Connector {name} needs authorization.{" "}
        {flow ? (
          <button type="button" onClick={authorize}>
            Authorize {name}
          </button>
        ) : (
          "Ask an admin to connect it."
        )}
        {problem ? ` (${problem})` : ""}
      </p>
    );
  }
  return (
    <p className="status connector">
      Connector {name}: {state}
      {state === "ready" ? ` (${String(data.tools ?? 0)} tools)` : ""}
      {data.error ? ` (${String(data.error)})` : ""}
    </p>
  );
}

function pretty(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function ToolCard({
  api,
  part,
  logs,
  delegate,
  onApprove,
}: {
  api: Api;
  part: AnyPart;
  logs: LogLine[];
  /** A `delegate` call's task, as this tab saw it progress. */
  delegate?: { name: string; progress: Progress };
  onApprove: (id: string, approved: boolean) => void;
}) {
  const name = part.type === "dynamic-tool" ? (part.toolName ?? "tool") : part.type.slice(5);
  const state = part.state ?? "";
  const label =
    {
      "input-streaming": "preparing",
      "input-available": "running",
      "approval-requested": "waiting for approval",
      "approval-responded": "answered",
      "output-available": "done",
      "output-error": "failed",
      "output-denied": "denied",
    }[state] ?? state;
  const output = state === "output-available" ? pretty(part.output) : undefined;
  return (
    <details className={`tool ${state}`} open>
      <summary>
        <span className="tool-name">{name}</span> <span className="tool-state">{label}</span>
      </summary>
      {part.input !== undefined && (
        <>
          <h4>Input</h4>
          <pre className="tool-input">{pretty(part.input)}</pre>
        </>
      )}
      {delegate && <DelegationCard name={delegate.name} progress={delegate.progress} />}
      {/* Transient: the live lines of this tab's stream; the result has the whole text. */}
      {logs.length > 0 && (
        <div className="live">
          <h4>Live output</h4>
          <pre className="tool-log">
            {logs.map((l, i) => (
              <span key={i} className={l.stream}>
                {l.text}
                {l.text.endsWith("\n") ? "" : "\n"}
              </span>
            ))}
          </pre>
        </div>
      )}
      {state === "approval-requested" && part.approval && (
        <div className="approval">
          <button type="button" onClick={() => onApprove(part.approval!.id, true)}>
            Approve
          </button>
          <button type="button" onClick={() => onApprove(part.approval!.id, false)}>
            Deny
          </button>
        </div>
      )}
      {output !== undefined && (
        <>
          <h4>Result</h4>
          <pre className="tool-output">{output}</pre>
          {artifactIds(output).map((id) => (
            <Artifact key={id} api={api} id={id} />
          ))}
        </>
      )}
      {state === "output-error" && (
        <>
          <h4>Error</h4>
          <pre className="tool-error">{part.errorText}</pre>
        </>
      )}
    </details>
  );
}

/** P5: an MCP server's question while its tool call waits (a `data-elicitation` part). */
interface Elicitation {
  approvalId: string;
  connector: string;
  message: string;
  requestedSchema: { properties?: Record<string, Field>; required?: string[] };
  expiresAt: string;
  state: string;
}

interface Field {
  type?: string;
  title?: string;
  description?: string;
  default?: unknown;
  enum?: string[];
  enumNames?: string[];
  oneOf?: { const: string; title?: string }[];
  anyOf?: { const: string; title?: string }[];
  items?: Field;
  format?: string;
  minimum?: number;
  maximum?: number;
}

const ENDED: Record<string, string> = {
  approved: "Sent.",
  denied: "Declined.",
  cancelled: "Cancelled.",
  expired: "Nobody answered in time.",
  superseded: "A new message was sent instead.",
};

/** The choices of a select: `enum` (with `enumNames`), or titled `oneOf` / `anyOf` consts. */
function choicesOf(field: Field | undefined): { value: string; label: string }[] {
  if (!field) return [];
  if (field.enum) return field.enum.map((v, i) => ({ value: v, label: field.enumNames?.[i] ?? v }));
  const titled = field.oneOf ?? field.anyOf ?? [];
  return titled.map((c) => ({ value: c.const, label: c.title ?? c.const }));
}

/** The form, pre-filled with each field's `default` (SEP-1034); a field left empty is not
 * sent. Accept sends the values, Decline refuses; the brain checks them against the form. */
function ElicitationForm({ api, data }: { api: Api; data: Elicitation }) {
  const fields = Object.entries(data.requestedSchema.properties ?? {});
  const required = new Set(data.requestedSchema.required ?? []);
  const [values, setValues] = useState<Record<string, unknown>>(() =>
    Object.fromEntries(fields.filter(([, f]) => f.default !== undefined).map(([k, f]) => [k, f.default])),
  );
  const [sent, setSent] = useState<string | undefined>();
  const [problem, setProblem] = useState<ApiError | undefined>();
  const ended = data.state !== "pending" ? data.state : sent;

  async function submit(answer: Parameters<Api["answerElicitation"]>[1]) {
    setProblem(undefined);
    try {
      await api.answerElicitation(data.approvalId, answer);
      setSent(answer.action === "accept" ? "approved" : answer.action === "decline" ? "denied" : "cancelled");
    } catch (err) {
      setProblem(err as ApiError);
    }
  }

  function onAccept(e: FormEvent) {
    e.preventDefault();
    const content = Object.fromEntries(
      Object.entries(values).filter(([, v]) => v !== "" && v !== undefined && !(Array.isArray(v) && v.length === 0)),
    );
    void submit({ action: "accept", content });
  }

  const set = (name: string, value: unknown) => setValues((all) => ({ ...all, [name]: value }));

  return (
    <form className="elicitation" aria-label={`Question from ${data.connector}`} onSubmit={onAccept}>
      <p className="elicitation-message">
        <strong>{data.connector}</strong> asks: {data.message}
      </p>
      {ended ? (
        <p className="elicitation-ended" role="status">
          {ENDED[ended] ?? ended}
        </p>
      ) : (
        <>
          {fields.map(([name, field]) => {
            const label = `${field.title ?? name}${required.has(name) ? " *" : ""}`;
            const id = `elicit-${data.approvalId}-${name}`;
            const choices = choicesOf(field);
            let input;
            if (field.type === "boolean") {
              input = (
                <input
                  id={id}
                  type="checkbox"
                  checked={values[name] === true}
                  onChange={(e) => set(name, e.target.checked)}
                />
              );
            } else if (field.type === "array") {
              const chosen = (values[name] as string[] | undefined) ?? [];
              input = (
                <select
                  id={id}
                  multiple
                  value={chosen}
                  onChange={(e) => set(name, Array.from(e.target.selectedOptions, (o) => o.value))}
                >
                  {choicesOf(field.items).map((c) => (
                    <option key={c.value} value={c.value}>
                      {c.label}
                    </option>
                  ))}
                </select>
              );
            } else if (choices.length > 0) {
              input = (
                <select id={id} value={String(values[name] ?? "")} onChange={(e) => set(name, e.target.value)}>
                  <option value="" />
                  {choices.map((c) => (
                    <option key={c.value} value={c.value}>
                      {c.label}
                    </option>
                  ))}
                </select>
              );
            } else if (field.type === "number" || field.type === "integer") {
              input = (
                <input
                  id={id}
                  type="number"
                  step={field.type === "integer" ? 1 : "any"}
                  min={field.minimum}
                  max={field.maximum}
                  value={values[name] === undefined ? "" : String(values[name])}
                  onChange={(e) => set(name, e.target.value === "" ? undefined : Number(e.target.value))}
                />
              );
            } else {
              const type = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" }[field.format ?? ""];
              input = (
                <input
                  id={id}
                  type={type ?? "text"}
                  value={String(values[name] ?? "")}
                  onChange={(e) => set(name, e.target.value)}
                />
              );
            }
            return (
              <div key={name} className="field">
                <label htmlFor={id} title={field.description}>
                  {label}
                </label>
                {input}
              </div>
            );
          })}
          <div className="approval">
            <button type="submit">Send</button>
            <button type="button" onClick={() => void submit({ action: "decline" })}>
              Decline
            </button>
          </div>
          {problem && (
            <p className="error" role="alert">
              <strong>{problem.code}</strong>: {explain(problem)}
            </p>
          )}
        </>
      )}
    </form>
  );
}
