// Runs one AG-UI run against the brain with the official client (@ag-ui/client's
// HttpAgent), which checks the event order and shapes as it reads them. Prints
// {events, messages, result, error, status, payload} as JSON.
// Usage: node run.mjs URL API_KEY THREAD_ID INPUT_JSON
// INPUT_JSON: {"text": "...", "messageId": "...", "history": [...], "resume": [...]}: the
// client's earlier messages (`history`), then its new user message; all but text optional.
import { HttpAgent } from "@ag-ui/client";

const [url, apiKey, threadId, inputJson] = process.argv.slice(2);
const input = JSON.parse(inputJson);
const agent = new HttpAgent({
  url,
  headers: { Authorization: `Bearer ${apiKey}` },
  threadId,
  initialMessages: [
    ...(input.history ?? []),
    ...(input.text
      ? [{ id: input.messageId ?? `msg-${Date.now()}`, role: "user", content: input.text }]
      : []),
  ],
});
const events = [];
const out = { events };
try {
  const { result, newMessages } = await agent.runAgent(
    { runId: input.runId ?? "run-1", ...(input.resume ? { resume: input.resume } : {}) },
    { onEvent: ({ event }) => void events.push(event) },
  );
  out.result = result ?? null;
  out.newMessages = newMessages;
} catch (error) {
  out.error = String(error?.message ?? error);
  if (error?.status !== undefined) out.status = error.status;
  if (error?.payload !== undefined) out.payload = error.payload;
}
out.messages = agent.messages;
process.stdout.write(JSON.stringify(out));
