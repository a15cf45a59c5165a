import type { UIMessage } from "ai";
import { useCallback, useEffect, useRef, useState, type FormEvent } from "react";
import {
  Api,
  ApiError,
  type Agent,
  type CatalogModel,
  type Chat,
  describe,
  MAX_TITLE_CHARS,
  explain,
  storedKey,
  storeKey,
  takeHandedToken,
  type WhoAmI,
} from "./api";
import { ChatView } from "./Chat";
import { MemoriesPanel } from "./memories";
import { AgentSettings, namesOf } from "./settings";

const PROFILES = ["none", "light", "browser", "heavy", "warm"];

function message(e: unknown): string {
  return e instanceof ApiError ? explain(e) : "Something went wrong. Try again.";
}

export function App() {
  const [refused, setRefused] = useState<string>();
  const signIn = useCallback((key: string) => {
    storeKey(key);
    setRefused(undefined);
    // A key revoked, or a token expired, while the page is open: back to sign-in, saying so.
    return new Api(key, () => {
      storeKey(null);
      setApi(null);
      setRefused("Your key or token was refused: it expired or was revoked. Sign in again.");
    });
  }, []);
  const [start] = useState(() => {
    const handed = takeHandedToken()?.token;
    const stored = storedKey();
    // A link must not silently sign a signed-in tab into another team (login CSRF): its
    // token is only offered, and the person decides.
    return handed && stored && handed !== stored ? { key: stored, offered: handed } : { key: handed ?? stored };
  });
  const [offered, setOffered] = useState(start.offered);
  const [api, setApi] = useState<Api | null>(() => (start.key ? signIn(start.key) : null));
  if (!api) return <SignIn notice={refused} onSignedIn={(key) => setApi(signIn(key))} />;
  if (offered) {
    return (
      <SwitchAccount
        current={api.key}
        offered={offered}
        onSwitch={() => {
          setOffered(undefined);
          setApi(signIn(offered));
        }}
        onKeep={() => {
          // The chat the link named belongs to the other sign-in.
          history.replaceState(null, "", location.pathname);
          setOffered(undefined);
        }}
      />
    );
  }
  return (
    <Workspace
      api={api}
      onSignOut={() => {
        storeKey(null);
        setApi(null);
      }}
    />
  );
}

function SignIn({ notice, onSignedIn }: { notice?: string; onSignedIn: (key: string) => void }) {
  const [key, setKey] = useState("");
  const [problem, setProblem] = useState<string>();
  async function submit(e: FormEvent) {
    e.preventDefault();
    const tried = new Api(key.trim());
    try {
      await tried.agents();
      onSignedIn(tried.key);
    } catch (err) {
      setProblem(message(err));
    }
  }
  return (
    <main className="signin">
      <h1>agent-runtime</h1>
      <form onSubmit={submit}>
        {notice && !problem && (
          <p className="error" role="alert">
            {notice}
          </p>
        )}
        <label htmlFor="key">API key or frontend token</label>
        <input
          id="key"
          type="password"
          autoComplete="off"
          value={key}
          placeholder="ar_…"
          onChange={(e) => setKey(e.target.value)}
        />
        <button type="submit" disabled={!key.trim()}>
          Sign in
        </button>
        <p className="hint">
          The key stays in this tab (sessionStorage). Create one with <code>brain admin create-team NAME</code>.
          An app that signs its users&apos; tokens opens this page at <code>/#token=…</code>.
        </p>
        {problem && (
          <p className="error" role="alert">
            {problem}
          </p>
        )}
      </form>
    </main>
  );
}

/** Who a key or token signs in as; or `refused` (`401`), or what else went wrong. */
type Known = WhoAmI | { problem: "refused" | string };

/** A plain `Api` (no sign-out on `401`): asking must not end the tab's sign-in. */
function useWhoAmI(key: string): Known | undefined {
  const [known, setKnown] = useState<Known>();
  useEffect(() => {
    new Api(key).whoami().then(setKnown, (e) =>
      setKnown({ problem: e instanceof ApiError && e.code === "unauthorized" ? "refused" : message(e) }),
    );
  }, [key]);
  return known;
}

function SwitchAccount({
  current,
  offered,
  onSwitch,
  onKeep,
}: {
  current: string;
  offered: string;
  onSwitch: () => void;
  onKeep: () => void;
}) {
  const now = useWhoAmI(current);
  const next = useWhoAmI(offered);
  return (
    <main className="signin switch">
      <h1>agent-runtime</h1>
      <h2>Switch accounts?</h2>
      <p>
        This tab is signed in as{" "}
        <strong>{now === undefined ? "…" : "problem" in now ? "a key or token that was refused" : describe(now)}</strong>.
      </p>
      {next !== undefined &&
        ("problem" in next ? (
          <p className="error" role="alert">
            {next.problem === "refused"
              ? "The link's token was refused: it is wrong, expired or revoked."
              : `The link's token could not be checked: ${next.problem}`}{" "}
            You stay signed in as before.
          </p>
        ) : (
          <p>
            The link you opened would sign this tab in as <strong>{describe(next)}</strong> instead. Switch only if you
            meant to: a link from someone else can sign you into their team, where what you type is theirs to read.
          </p>
        ))}
      <div className="row">
        <button type="button" onClick={onKeep}>
          Keep current sign-in
        </button>
        {next !== undefined && !("problem" in next) && (
          <button type="button" onClick={onSwitch}>
            Switch account
          </button>
        )}
      </div>
    </main>
  );
}

function Workspace({ api, onSignOut }: { api: Api; onSignOut: () => void }) {
  const who = useWhoAmI(api.key);
  const [agents, setAgents] = useState<Agent[]>([]);
  const [agentId, setAgentId] = useState<string>();
  const [chats, setChats] = useState<Chat[]>([]);
  const [chatId, setChatId] = useState<string>();
  const [opened, setOpened] = useState<{ messages: UIMessage[] }>();
  const [creating, setCreating] = useState(false);
  const [menuOpen, setMenuOpen] = useState(true);
  const [problem, setProblem] = useState<string>();

  useEffect(() => {
    api.agents().then(setAgents, (e) => setProblem(message(e)));
    // A reload reopens the chat named in the address (#agent/chat).
    const [a, c] = location.hash.slice(1).split("/");
    if (a) setAgentId(a);
    if (a && c) void openChat(c);
  }, [api]);

  useEffect(() => {
    history.replaceState(null, "", agentId ? `#${agentId}${chatId ? `/${chatId}` : ""}` : location.pathname);
  }, [agentId, chatId]);

  useEffect(() => {
    setChats([]);
    if (agentId) api.chats(agentId).then(setChats, (e) => setProblem(message(e)));
  }, [api, agentId]);

  // A chat's title is written just after its first answer: the list is read again a
  // little later, while a chat of it has none.
  const agentRef = useRef(agentId);
  agentRef.current = agentId;
  const chatsRef = useRef(chats);
  chatsRef.current = chats;
  const refreshTitlesSoon = useCallback(() => {
    const agent = agentRef.current;
    if (!agent || chatsRef.current.every((c) => c.title !== null)) return;
    window.setTimeout(() => {
      if (agentRef.current === agent) api.chats(agent).then(setChats, () => undefined);
    }, 3000);
  }, [api]);

  const [statuses, setStatuses] = useState<Record<string, string>>({});
  const [turns, setTurns] = useState<Record<string, string>>({});
  const load = useCallback(
    async (id: string) => {
      const stored = await api.messages(id);
      const next: Record<string, string> = {};
      const byTurn: Record<string, string> = {};
      for (const m of stored) {
        next[m.id] = m.status;
        if (m.turn_id) byTurn[m.id] = m.turn_id;
      }
      setStatuses(next);
      setTurns(byTurn);
      refreshTitlesSoon();
      return stored.map((m) => ({ id: m.id, role: m.role, parts: m.parts }) as UIMessage);
    },
    [api, refreshTitlesSoon],
  );

  async function openChat(id: string) {
    setProblem(undefined);
    try {
      const messages = await load(id);
      setOpened({ messages });
      setChatId(id);
      setMenuOpen(false);
    } catch (e) {
      setProblem(message(e));
    }
  }

  async function newChat() {
    if (!agentId) return;
    try {
      const chat = await api.createChat(agentId);
      setChats((c) => [chat, ...c]);
      setOpened({ messages: [] });
      setStatuses({});
      setChatId(chat.id);
      setMenuOpen(false);
    } catch (e) {
      setProblem(message(e));
    }
  }

  async function deleteChat(id: string) {
    if (!window.confirm("Delete this chat, its messages and its files for good?")) return;
    try {
      await api.deleteChat(id);
      setChats((c) => c.filter((chat) => chat.id !== id));
      if (id === chatId) {
        setChatId(undefined);
        setOpened(undefined);
      }
    } catch (e) {
      setProblem(message(e));
    }
  }

  const [renaming, setRenaming] = useState<string>();
  async function renameChat(id: string, title: string) {
    try {
      const renamed = await api.renameChat(id, title);
      setChats((c) => c.map((chat) => (chat.id === id ? renamed : chat)));
      setRenaming(undefined);
    } catch (e) {
      setProblem(message(e));
    }
  }

  const agent = agents.find((a) => a.id === agentId);
  return (
    <div className="workspace">
      <header className="top">
        <button
          type="button"
          className="menu"
          aria-expanded={menuOpen}
          aria-controls="sidebar"
          onClick={() => setMenuOpen((o) => !o)}
        >
          Menu
        </button>
        <h1>{agent ? agent.name : "agent-runtime"}</h1>
        {who && (
          <p className="signed-in">
            {"problem" in who ? "Signed in (who could not be checked)" : `Signed in: ${describe(who)}`}
          </p>
        )}
        <button type="button" onClick={onSignOut}>
          Sign out
        </button>
      </header>
      <nav id="sidebar" className={menuOpen ? "sidebar open" : "sidebar"} aria-label="Agents and chats">
        <h2>Agents</h2>
        <ul className="list">
          {agents.map((a) => (
            <li key={a.id}>
              <button
                type="button"
                aria-current={a.id === agentId}
                onClick={() => {
                  setAgentId(a.id);
                  setChatId(undefined);
                }}
              >
                {a.name} <small>{a.runtime_profile}</small>
              </button>
            </li>
          ))}
        </ul>
        {creating ? (
          <CreateAgent
            api={api}
            onCreated={(a) => {
              setAgents((all) => [a, ...all]);
              setAgentId(a.id);
              setChatId(undefined);
              setCreating(false);
            }}
            onCancel={() => setCreating(false)}
          />
        ) : (
          <button type="button" onClick={() => setCreating(true)}>
            New agent
          </button>
        )}
        {agent && (
          <>
            <h2>Chats with {agent.name}</h2>
            <button type="button" onClick={newChat}>
              New chat
            </button>
            <ul className="list">
              {chats.map((c) =>
                renaming === c.id ? (
                  <li key={c.id}>
                    <RenameChat
                      current={c.title ?? ""}
                      onSave={(title) => renameChat(c.id, title)}
                      onCancel={() => setRenaming(undefined)}
                    />
                  </li>
                ) : (
                  <li key={c.id}>
                    <button type="button" aria-current={c.id === chatId} onClick={() => openChat(c.id)}>
                      {chatLabel(c)}
                    </button>
                    <button
                      type="button"
                      className="action"
                      aria-label="Rename chat"
                      title="Rename this chat"
                      onClick={() => setRenaming(c.id)}
                    >
                      Rename
                    </button>
                    <button
                      type="button"
                      className="delete"
                      aria-label="Delete chat"
                      title="Delete this chat for good"
                      onClick={() => deleteChat(c.id)}
                    >
                      Delete
                    </button>
                  </li>
                ),
              )}
            </ul>
            <AgentSettings
              key={agent.id}
              api={api}
              agent={agent}
              agents={agents}
              onSaved={(saved) => setAgents((all) => all.map((a) => (a.id === saved.id ? saved : a)))}
            />
            <MemoriesPanel api={api} agentId={agent.id} />
          </>
        )}
      </nav>
      <main className="main">
        {problem && (
          <p className="error" role="alert">
            {problem}
          </p>
        )}
        {chatId && opened ? (
          <ChatView
            key={chatId}
            api={api}
            agents={agents}
            chatId={chatId}
            initial={opened.messages}
            statuses={statuses}
            turns={turns}
            reload={() => load(chatId)}
          />
        ) : (
          <p className="empty">
            {agents.length === 0
              ? "Create an agent to start."
              : agent
                ? "Open a chat or start a new one."
                : "Pick an agent."}
          </p>
        )}
      </main>
    </div>
  );
}

/** What a catalog model can do and costs, as its suggestion shows it. */
function modelFacts(m: CatalogModel): string {
  return [
    m.tools && "tools",
    m.vision && "vision",
    m.context_window && `${m.context_window.toLocaleString()} tokens`,
    m.pricing && `$${m.pricing.input_per_mtok}/$${m.pricing.output_per_mtok} per M tokens`,
  ]
    .filter(Boolean)
    .join(", ");
}

/** A chat in the list: its title, else the start of its summary, else when it began. */
function chatLabel(c: Chat): string {
  if (c.title) return c.title;
  if (c.summary) return c.summary.slice(0, 60);
  return new Date(c.created_at).toLocaleString();
}

function RenameChat({
  current,
  onSave,
  onCancel,
}: {
  current: string;
  onSave: (title: string) => void;
  onCancel: () => void;
}) {
  const [title, setTitle] = useState(current);
  function submit(e: FormEvent) {
    e.preventDefault();
    if (title.trim()) onSave(title.trim());
  }
  return (
    <form className="rename" onSubmit={submit} aria-label="Rename chat">
      <input
        aria-label="Chat title"
        value={title}
        maxLength={MAX_TITLE_CHARS}
        autoFocus
        onChange={(e) => setTitle(e.target.value)}
        onKeyDown={(e) => {
          if (e.key === "Escape") onCancel();
        }}
        required
      />
      <button type="submit" disabled={!title.trim()}>
        Save
      </button>
      <button type="button" onClick={onCancel}>
        Cancel
      </button>
    </form>
  );
}

function CreateAgent({
  api,
  onCreated,
  onCancel,
}: {
  api: Api;
  onCreated: (a: Agent) => void;
  onCancel: () => void;
}) {
  const [name, setName] = useState("");
  const [prompt, setPrompt] = useState("You are a helpful assistant.");
  const [model, setModel] = useState("openai/gpt-4o-mini");
  const [profile, setProfile] = useState("light");
  const [skills, setSkills] = useState("");
  const [problem, setProblem] = useState<string>();
  const [catalog, setCatalog] = useState<CatalogModel[]>([]);
  useEffect(() => {
    void api.models().then(setCatalog);
  }, [api]);
  async function submit(e: FormEvent) {
    e.preventDefault();
    try {
      onCreated(
        await api.createAgent({
          name: name.trim(),
          system_prompt: prompt,
          model: model.trim(),
          runtime_profile: profile,
          // B8: the team's skills by name, comma-separated; an unknown one is refused.
          skills: namesOf(skills),
        }),
      );
    } catch (err) {
      setProblem(message(err));
    }
  }
  return (
    <form className="create-agent" onSubmit={submit} aria-label="New agent">
      <label htmlFor="agent-name">Name</label>
      <input id="agent-name" value={name} onChange={(e) => setName(e.target.value)} required />
      <label htmlFor="agent-prompt">System prompt</label>
      <textarea id="agent-prompt" value={prompt} rows={3} onChange={(e) => setPrompt(e.target.value)} />
      <label htmlFor="agent-model">Model</label>
      <input
        id="agent-model"
        list="agent-models"
        value={model}
        onChange={(e) => setModel(e.target.value)}
        required
      />
      <datalist id="agent-models">
        {catalog.map((m) => (
          <option key={m.id} value={m.id}>
            {modelFacts(m)}
          </option>
        ))}
      </datalist>
      <label htmlFor="agent-profile">Runtime profile (hands)</label>
      <select id="agent-profile" value={profile} onChange={(e) => setProfile(e.target.value)}>
        {PROFILES.map((p) => (
          <option key={p} value={p}>
            {p}
          </option>
        ))}
      </select>
      <label htmlFor="agent-skills">Skills (names, comma-separated)</label>
      <input
        id="agent-skills"
        value={skills}
        placeholder="pdf-processing, release-notes"
        onChange={(e) => setSkills(e.target.value)}
      />
      <div className="row">
        <button type="submit" disabled={!name.trim()}>
          Create agent
        </button>
        <button type="button" onClick={onCancel}>
          Cancel
        </button>
      </div>
      {problem && (
        <p className="error" role="alert">
          {problem}
        </p>
      )}
    </form>
  );
}
