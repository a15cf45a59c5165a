// Sends one user message the way a stock `useChat` frontend does (DefaultChatTransport)
// and rebuilds the assistant message with the AI SDK's own stream reader. Prints the final
// UI message as JSON. Usage: node chat.mjs URL API_KEY TEXT
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [url, apiKey, text] = process.argv.slice(2);
const transport = new DefaultChatTransport({
  api: url,
  headers: { Authorization: `Bearer ${apiKey}` },
});
const stream = await transport.sendMessages({
  chatId: "client-chat",
  trigger: "submit-message",
  messageId: undefined,
  messages: [{ id: "client-msg-1", role: "user", parts: [{ type: "text", text }] }],
  abortSignal: undefined,
});
let last;
for await (const message of readUIMessageStream({
  stream,
  onError: (error) => {
    throw error;
  },
})) {
  last = message;
}
if (!last) throw new Error("no message in the stream");
process.stdout.write(JSON.stringify(last));
