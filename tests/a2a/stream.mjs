// Streams one message to the brain's A2A server with the official JavaScript SDK
// (npm @a2a-js/sdk), for brain/tests/all/a2a.rs. Prints the events it got as JSON.
//
//     node stream.mjs BASE_URL BEARER TEXT
//
// BASE_URL is the agent's (http://host/a2a/<agent_id>); the card is resolved from it.
import { randomUUID } from "node:crypto";
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
} from "@a2a-js/sdk/client";
import { Role } from "@a2a-js/sdk";

const [baseUrl, bearer, text] = process.argv.slice(2);

const authFetch = (url, init = {}) => {
  const headers = new Headers(init.headers);
  headers.set("Authorization", `Bearer ${bearer}`);
  return fetch(url, { ...init, headers });
};

const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl: authFetch })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl: authFetch }),
  }),
);
// The SDK resolves the card path relative to the base URL: with a trailing slash it stays
// under /a2a/<agent_id>/.
const client = await factory.createFromUrl(baseUrl.endsWith("/") ? baseUrl : `${baseUrl}/`);
const events = [];
for await (const event of client.sendMessageStream({
  message: {
    messageId: randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: text } }],
  },
})) {
  const payload = event.payload;
  events.push({ kind: payload?.$case, value: payload?.value });
}
process.stdout.write(JSON.stringify(events));
