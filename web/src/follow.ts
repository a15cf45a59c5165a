// Follows a chat's events stream (GET /v1/chats/{id}/events, SPEC S2) so a turn started
// elsewhere (another tab, an autostart tick, an approval answered by another client) shows
// up live. `fetch` rather than EventSource, which cannot send the bearer key.

import { readUIMessageStream, type UIMessage, type UIMessageChunk } from "ai";
import type { Api } from "./api";

export interface FollowHandlers {
  /** Whether a turn is this tab's own (streamed by its POST already). */
  isOwn: (turnId: string) => boolean;
  /** The message of a followed turn, as it grows. */
  onMessage: (message: UIMessage) => void;
  /** A transient part of a followed turn (live worker output), which no message keeps. */
  onData: (part: UIMessageChunk) => void;
  /** A turn ended (whether or not it was followed from its start). */
  onTurnEnd: () => void;
}

export function follow(api: Api, chatId: string, handlers: FollowHandlers): () => void {
  const abort = new AbortController();
  let lastId: string | undefined;
  void (async () => {
    while (!abort.signal.aborted) {
      try {
        const response = await fetch(`/v1/chats/${chatId}/events`, {
          headers: { ...api.authHeaders, ...(lastId ? { "Last-Event-ID": lastId } : {}) },
          signal: abort.signal,
        });
        if (response.ok && response.body) {
          await read(response.body, (id) => (lastId = id), handlers);
        }
      } catch {
        // Reconnected below, from the last id seen.
      }
      if (!abort.signal.aborted) await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  return () => abort.abort();
}

async function read(
  body: ReadableStream<Uint8Array>,
  seen: (id: string) => void,
  handlers: FollowHandlers,
) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  // The turn being followed: chunks go to the AI SDK's own message builder.
  let turn: { own: boolean; sink?: ReadableStreamDefaultController<UIMessageChunk> } | undefined;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end: number;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let data = "";
      for (const line of event.split("\n")) {
        if (line.startsWith("id:")) seen(line.slice(3).trim());
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (!data) continue;
      let chunk: UIMessageChunk & { data?: { turnId?: string } };
      try {
        chunk = JSON.parse(data);
      } catch {
        continue;
      }
      if (chunk.type === "data-turn") {
        const turnId = chunk.data?.turnId ?? "";
        if (!turn || turn.own !== handlers.isOwn(turnId)) turn = { own: handlers.isOwn(turnId) };
        continue;
      }
      if (!turn || turn.own) continue;
      // A second `start` of the turn: it was taken over by another replica (D5) and its
      // stream starts over from its durable steps, so its message is built anew.
      if (chunk.type === "start") {
        turn.sink?.close();
        const stream = new ReadableStream<UIMessageChunk>({ start: (c) => void (turn!.sink = c) });
        void (async () => {
          try {
            for await (const message of readUIMessageStream({ stream })) handlers.onMessage(message);
          } catch {
            // A malformed turn is left to the transcript reload at its end.
          }
        })();
      }
      // Joined mid-turn (no `start` seen): nothing to build on; the end reloads.
      turn.sink?.enqueue(chunk);
      if (chunk.type.startsWith("data-")) handlers.onData(chunk);
      if (chunk.type === "finish" || chunk.type === "error" || chunk.type === "abort") {
        turn.sink?.close();
        turn = undefined;
        handlers.onTurnEnd();
      }
    }
  }
}
