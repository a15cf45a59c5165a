// The brain's REST API as the page uses it. Every call carries the key the user signed in
// with; the key lives in sessionStorage only (gone when the tab closes).

const KEY_STORAGE = "agent-runtime.key";

export function storedKey(): string | null {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function storeKey(key: string | null) {
  if (key === null) sessionStorage.removeItem(KEY_STORAGE);
  else sessionStorage.setItem(KEY_STORAGE, key);
}

export interface Agent {
  id: string;
  name: string;
  system_prompt: string;
  model: string;
  runtime_profile: string;
  /** The agents of the team this one may hand tasks to (B7), by id. */
  delegates: string[];
  /** The team's skills this agent uses (B8), by name. */
  skills: string[];
  created_at: string;
}

export interface Chat {
  id: string;
  agent_id: string;
  summary: string | null;
  /** A short title, generated after the first turn or set by a person; `null` until then
   * (T17). */
  title: string | null;
  created_at: string;
}

/** A note the agent keeps across chats (M4): `user_id` is whose it is, `null` the agent's own. */
export interface Memory {
  id: string;
  content: string;
  user_id: string | null;
  chat_id: string | null;
  created_at: string;
}

/** The longest title a person may give a chat (`PATCH /v1/chats/{id}`). */
export const MAX_TITLE_CHARS = 80;

/** A route of the team's model catalog (`GET /v1/models`, T16). */
export interface CatalogModel {
  /** The route an agent names: `<connection>/<model>`. */
  id: string;
  tools: boolean;
  vision: boolean;
  context_window: number | null;
  /** USD per million tokens, where known. */
  pricing: { input_per_mtok: number; output_per_mtok: number } | null;
}

export interface StoredMessage {
  id: string;
  turn_id: string | null;
  role: "user" | "assistant" | "system";
  parts: unknown[];
  /** `queued`: waiting for the busy agent; `withdrawn`: stopped while queued, never sent
   * to the model (T13). */
  status: "complete" | "interrupted" | "queued" | "withdrawn";
  created_at: string;
}

/** Who a key or token signs in as (`GET /v1/whoami`). */
export interface WhoAmI {
  team_id: string;
  team_name: string;
  /** The token's user; `null` for an API key. */
  user: string | null;
  scope: "admin" | "chat";
}

/** "team …, user …" (or "API key" for a key), as the page shows who is signed in. */
export function describe(who: WhoAmI): string {
  return `team ${who.team_name}, ${who.user === null ? "API key" : `user ${who.user}`} (${who.scope})`;
}

/** A file uploaded to a chat (`POST /v1/chats/{id}/files`, T21): `url` is signed (T26),
 * so an `<img src>` or a download link follows it without the key for a while. */
export interface ChatFile {
  id: string;
  url: string;
  media_type: string;
  size: number;
  filename: string;
}

/** Whether `url` names a file of this brain (`/v1/files/{id}`, signed): the only file
 * URLs the page shows or links to. */
export function isFileUrl(url: string | undefined): url is string {
  return typeof url === "string" && /^\/v1\/files\/[0-9a-f-]{36}(\?[A-Za-z0-9=&_-]*)?$/.test(url);
}

export interface ArtifactMeta {
  id: string;
  name: string;
  content_type: string;
  size_bytes: number;
}

/** An error answer of the API, or an `error` chunk of a stream, by its stable code. */
export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

/** Reads `{"error":{"code","message"}}` (an HTTP error body) or `"<code>: <message>"`
 * (a stream's `errorText`); anything else keeps its text under `unknown`. */
export function parseError(raw: string, status?: number): ApiError {
  try {
    const body = JSON.parse(raw);
    if (body && typeof body.error?.code === "string") {
      return new ApiError(body.error.code, String(body.error.message ?? ""), status);
    }
  } catch {
    // Not JSON: a stream's errorText.
  }
  const m = /^([a-z_]+): ([\s\S]*)$/.exec(raw);
  if (m) return new ApiError(m[1], m[2], status);
  return new ApiError("unknown", raw, status);
}

/** What to tell the user for each code: what happened and what to do. */
export function explain(err: ApiError): string {
  switch (err.code) {
    case "agent_busy":
      return "This agent is already running a turn (in this chat or another). Wait for it to finish, or stop it, then send again.";
    case "queue_full":
      return "Too many messages already wait for this agent. Wait for it to answer some, then send again.";
    case "turn_in_progress":
      return "This message is still being answered. Wait for it to finish.";
    case "rate_limited":
      return "The model provider is rate limiting requests. Wait a moment, then send again.";
    case "quota_exceeded":
      return "Your team reached a rate or concurrency quota. Wait a minute and send again, or ask an admin to raise it.";
    case "quota_exhausted":
      return "Your team's model budget for this period is spent. It resets later; an admin can raise the quota.";
    case "provider_unavailable":
      return "The model provider cannot be reached right now. Try again in a moment.";
    case "provider_rejected":
      return "The model provider refused the request. Check the agent's model name and the brain's provider key.";
    case "unauthorized":
      return "The key or token was refused (wrong, revoked or expired). Sign in again with a valid one.";
    case "forbidden":
      return "This key may not do that: it needs the admin scope.";
    case "not_found":
      return "Not found: it may have been archived or belongs to another team. Reload the list.";
    case "store_unavailable":
    case "storage_unavailable":
    case "auth_unavailable":
      return "The server's storage is unavailable. Nothing was done; try again shortly.";
    case "invalid_request":
      return `The request was refused: ${err.message}`;
    case "file_too_large":
      return `The file is too large: ${err.message}.`;
    case "message_files_too_large":
      return `These files are too large together: ${err.message}. Send them in several messages.`;
    case "file_quota_exceeded":
      return "Your team's stored files are at their quota. Delete old chats to free room, or ask an admin to raise it.";
    case "invalid_file_url":
      return "This file's link has expired. Reload the chat for a fresh one.";
    case "network":
      return "The server could not be reached. Check your connection and try again.";
    default:
      return err.message || "Something went wrong. Try again.";
  }
}

/** A frontend token handed over in the address (`#token=<jwt>`, optionally
 * `&chat=<agent id>/<chat id>`), as an app that signs its users' tokens opens the chat: the
 * token leaves the address (and the history) at once. It is stored only in a tab that holds
 * no credential yet, or once the person agrees to switch (a link must not silently sign a
 * tab into another team: login CSRF). */
export function takeHandedToken(): { token: string; open?: string } | null {
  if (!location.hash.startsWith("#token=")) return null;
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token")?.trim();
  const open = params.get("chat") ?? undefined;
  history.replaceState(null, "", open ? `#${open}` : location.pathname);
  return token ? { token, open } : null;
}

export class Api {
  /** `onRefused` runs when the server refuses the key or token (`401`): revoked, or a
   * token that expired. */
  constructor(
    readonly key: string,
    private readonly onRefused?: () => void,
  ) {}

  get authHeaders(): Record<string, string> {
    return { Authorization: `Bearer ${this.key}` };
  }

  private async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    let response: Response;
    try {
      response = await fetch(path, {
        method,
        headers: {
          ...this.authHeaders,
          ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch {
      throw new ApiError("network", "network error");
    }
    if (response.status === 401) this.onRefused?.();
    if (!response.ok) throw parseError(await response.text(), response.status);
    if (response.status === 204) return undefined as T;
    return (await response.json()) as T;
  }

  whoami(): Promise<WhoAmI> {
    return this.request("GET", "/v1/whoami");
  }

  async agents(): Promise<Agent[]> {
    return (await this.request<{ agents: Agent[] }>("GET", "/v1/agents?limit=200")).agents;
  }

  createAgent(agent: {
    name: string;
    system_prompt: string;
    model: string;
    runtime_profile: string;
    /** The names of the team's skills the agent uses (B8). */
    skills: string[];
  }): Promise<Agent> {
    return this.request("POST", "/v1/agents", agent);
  }

  /** Changes what an agent delegates to and which skills it uses; an unknown delegate or
   * skill is refused (`unknown_delegate`, `unknown_skill`) and changes nothing. */
  updateAgent(agentId: string, change: { delegates: string[]; skills: string[] }): Promise<Agent> {
    return this.request("PATCH", `/v1/agents/${agentId}`, change);
  }

  async chats(agentId: string): Promise<Chat[]> {
    return (await this.request<{ chats: Chat[] }>("GET", `/v1/agents/${agentId}/chats?limit=200`))
      .chats;
  }

  createChat(agentId: string): Promise<Chat> {
    return this.request("POST", `/v1/agents/${agentId}/chats`);
  }

  /** A person's title for the chat; it stays whatever a late generated one says. */
  renameChat(chatId: string, title: string): Promise<Chat> {
    return this.request("PATCH", `/v1/chats/${chatId}`, { title });
  }

  /** The routes the team can use, for the model field's suggestions; none when the
   * catalog cannot be read (the field takes any route all the same). */
  async models(): Promise<CatalogModel[]> {
    try {
      return (await this.request<{ data: CatalogModel[] }>("GET", "/v1/models")).data;
    } catch {
      return [];
    }
  }

  // The transcript comes a page at a time, newest first (each page oldest first inside);
  // the chat shows it whole, so pages are read back to the first message. The bound keeps a
  // runaway cursor from looping.
  async messages(chatId: string): Promise<StoredMessage[]> {
    const pages: StoredMessage[][] = [];
    let before: string | undefined;
    for (let page = 0; page < 100; page++) {
      const query = before === undefined ? "?limit=200" : `?limit=200&before=${encodeURIComponent(before)}`;
      const body = await this.request<{ messages: StoredMessage[]; next_cursor?: string }>(
        "GET",
        `/v1/chats/${chatId}/messages${query}`,
      );
      pages.unshift(body.messages);
      if (body.next_cursor === undefined) break;
      before = body.next_cursor;
    }
    return pages.flat();
  }

  /** Sends a message that waits its turn (T13): it runs now in the background if the agent
   * is free, else it is queued behind the running turn. Either way the chat's events
   * stream shows it when it runs. */
  enqueue(
    chatId: string,
    content: string,
  ): Promise<{ turn_id: string; message_id: string; status: string; position?: number }> {
    return this.request("POST", `/v1/chats/${chatId}/messages`, {
      content,
      background: true,
      if_busy: "enqueue",
    });
  }

  /** Sends a message ahead of the agent's queue (T13): the server stops the running turn,
   * wherever it runs, and starts this one in the background in the same request, holding
   * the queue back meanwhile; the chat's events stream shows it. */
  interrupt(chatId: string, content: string): Promise<{ turn_id: string; message_id: string }> {
    return this.request("POST", `/v1/chats/${chatId}/messages`, {
      content,
      background: true,
      if_busy: "interrupt",
    });
  }

  /** What the agent remembers that this key or token may see (an end user: their own). */
  async memories(agentId: string): Promise<Memory[]> {
    return (await this.request<{ memories: Memory[] }>("GET", `/v1/agents/${agentId}/memories?limit=200`))
      .memories;
  }

  deleteMemory(memoryId: string): Promise<void> {
    return this.request("DELETE", `/v1/memories/${memoryId}`);
  }

  /** Erases the chat (L2): its messages, files and worker go for good. */
  deleteChat(chatId: string): Promise<void> {
    return this.request("DELETE", `/v1/chats/${chatId}`);
  }

  stopTurn(turnId: string): Promise<unknown> {
    return this.request("POST", `/v1/turns/${turnId}/stop`);
  }

  stopChat(chatId: string): Promise<unknown> {
    return this.request("POST", `/v1/chats/${chatId}/stop`);
  }

  /** P5: answers an MCP server's question (an elicitation) the chat's turn waits on. */
  answerElicitation(
    approvalId: string,
    answer: { action: "accept"; content: Record<string, unknown> } | { action: "decline" | "cancel" },
  ): Promise<unknown> {
    return this.request("POST", `/v1/approvals/${approvalId}`, answer);
  }

  /** B2: a connector flow a turn of this principal began (the status's link, on this
   * origin), answered with the authorization URL; the answer's cookie binds the flow to
   * this browser, whose callback alone can finish it. */
  async continueAuthorization(link: string): Promise<string> {
    const path = new URL(link).pathname;
    return (await this.request<{ authorization_url: string }>("POST", path)).authorization_url;
  }

  /** Stores a file in the chat (T21); the brain sniffs its type and refuses it with a code
   * (`file_too_large`, `file_quota_exceeded`, `invalid_request` for a broken image). */
  async uploadFile(chatId: string, file: File): Promise<ChatFile> {
    const form = new FormData();
    form.append("file", file, file.name);
    let response: Response;
    try {
      // No Content-Type of our own: the browser writes the form's boundary in it.
      response = await fetch(`/v1/chats/${chatId}/files`, { method: "POST", headers: this.authHeaders, body: form });
    } catch {
      throw new ApiError("network", "network error");
    }
    if (response.status === 401) this.onRefused?.();
    if (!response.ok) throw parseError(await response.text(), response.status);
    return (await response.json()) as ChatFile;
  }

  artifactMeta(id: string): Promise<ArtifactMeta> {
    return this.request("GET", `/v1/artifacts/${id}/meta`);
  }

  async artifactBlob(id: string): Promise<Blob> {
    const response = await fetch(`/v1/artifacts/${id}`, { headers: this.authHeaders });
    if (!response.ok) throw parseError(await response.text(), response.status);
    return response.blob();
  }
}
