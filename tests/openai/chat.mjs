// The official OpenAI Node SDK against the brain's OpenAI-compatible API, for
// brain/tests/all/openai.rs: `node chat.mjs <base_url> <api_key> <request json>` prints one
// JSON report, as client.py does (`responses` streamed through `create({stream: true})`,
// the raw events, and `output_text` from the completed response).
import OpenAI, { APIError } from "openai";

const [baseURL, apiKey, raw] = process.argv.slice(2);
const request = JSON.parse(raw);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

async function chat() {
  const body = { model: request.model, messages: request.messages };
  if (request.user) body.user = request.user;
  if (request.metadata) body.metadata = request.metadata;
  const options = request.chat_id ? { headers: { "X-Chat-Id": request.chat_id } } : {};
  if (request.stream) {
    body.stream = true;
    if (request.include_usage) body.stream_options = { include_usage: true };
    const { data: stream, response } = await client.chat.completions
      .create(body, options)
      .withResponse();
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const choices = chunks.filter((c) => c.choices.length > 0).map((c) => c.choices[0]);
    const usage = chunks.filter((c) => c.usage).map((c) => c.usage);
    return {
      chat_id: response.headers.get("x-chat-id"),
      content: choices.map((c) => c.delta.content ?? "").join(""),
      chunks,
      finish_reason: choices.at(-1)?.finish_reason ?? null,
      usage: usage.at(-1) ?? null,
      tool_calls: choices.some((c) => c.delta.tool_calls),
    };
  }
  const { data: completion, response } = await client.chat.completions
    .create(body, options)
    .withResponse();
  return {
    chat_id: response.headers.get("x-chat-id"),
    id: completion.id,
    object: completion.object,
    content: completion.choices[0].message.content,
    finish_reason: completion.choices[0].finish_reason,
    tool_calls: completion.choices[0].message.tool_calls ?? null,
    usage: completion.usage ?? null,
  };
}

async function responses() {
  const body = { model: request.model, input: request.input };
  for (const name of ["previous_response_id", "instructions", "user", "background"]) {
    if (name in request) body[name] = request[name];
  }
  if (request.stream) {
    const events = [];
    for await (const event of await client.responses.create({ ...body, stream: true })) {
      events.push(event);
    }
    const final = events.findLast((e) => e.type === "response.completed")?.response ?? null;
    return {
      response: final,
      output_text: events.find((e) => e.type === "response.output_text.done")?.text ?? null,
      events: events.map((e) => e.type),
      sequence: events.map((e) => e.sequence_number),
      deltas: events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta),
    };
  }
  const { data: response, response: raw } = await client.responses.create(body).withResponse();
  return { chat_id: raw.headers.get("x-chat-id"), response, output_text: response.output_text };
}

// The type, number and delta of each event, and the response the last one carries.
function brief(events) {
  return {
    events: events.map((e) => ({ type: e.type, sequence_number: e.sequence_number, delta: e.delta ?? null })),
    response: events.findLast((e) => e.response)?.response ?? null,
  };
}

// A background response streamed until `cut` deltas arrived, the stream closed (leaving
// the loop aborts it), then resumed by `retrieve(id, {stream: true, starting_after})`.
async function backgroundStream() {
  const first = [];
  const stream = await client.responses.create({
    model: request.model, input: request.input, background: true, stream: true,
  });
  for await (const event of stream) {
    first.push(event);
    if (first.filter((e) => e.type === "response.output_text.delta").length >= request.cut) break;
  }
  const id = first[0].response.id;
  const after = first.at(-1).sequence_number;
  return { id, first: brief(first), rest: await resume(id, after) };
}

async function resume(id, after) {
  const events = [];
  for await (const event of await client.responses.retrieve(id, { stream: true, starting_after: after })) {
    events.push(event);
  }
  return brief(events);
}

let report;
try {
  if (request.op === "models") report = { models: (await client.models.list()).data };
  else if (request.op === "responses") report = await responses();
  else if (request.op === "retrieve") report = { response: await client.responses.retrieve(request.id) };
  else if (request.op === "background_stream") report = await backgroundStream();
  else if (request.op === "resume") report = await resume(request.id, request.after);
  else if (request.op === "cancel") report = { response: await client.responses.cancel(request.id) };
  else report = await chat();
} catch (e) {
  if (!(e instanceof APIError)) throw e;
  report = {
    error: { status: e.status ?? null, code: e.code ?? null, type: e.type ?? null, message: e.message },
  };
}
console.log(JSON.stringify(report));
