// The stock `useChat` approval flow without React: the AI SDK's own Chat (AbstractChat
// over a plain in-memory state) sends a message, receives the `tool-approval-request`,
// answers it with `addToolApprovalResponse`, and re-posts automatically
// (`lastAssistantMessageIsCompleteWithApprovalResponses`), as a frontend does. Prints the
// final messages as JSON. Usage: node approve.mjs URL API_KEY TEXT
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

const [url, apiKey, text] = process.argv.slice(2);

class State {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor(options) {
    super({ ...options, state: new State() });
  }
}

let failure;
const chat = new Chat({
  transport: new DefaultChatTransport({
    api: url,
    headers: { Authorization: `Bearer ${apiKey}` },
  }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onError: (error) => {
    failure = error;
  },
});

await chat.sendMessage({ text });
if (failure) throw failure;
const asking = chat.messages.at(-1);
const part = asking.parts.find((p) => p.state === "approval-requested");
if (!part) throw new Error(`no approval request in ${JSON.stringify(asking)}`);
await chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
// The automatic re-post runs as a job of the chat; wait for it to finish.
for (let i = 0; i < 500 && !(chat.status === "ready" && chat.messages.at(-1).parts.some(
  (p) => p.toolCallId === part.toolCallId && p.state === "output-available")); i++) {
  if (failure) throw failure;
  await new Promise((resolve) => setTimeout(resolve, 10));
}
if (failure) throw failure;
process.stdout.write(JSON.stringify(chat.messages));
