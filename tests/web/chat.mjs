// Drives the web chat in Debian's chromium against a live brain whose scripted model has
// its replies queued by brain/tests/all/web_chat.rs.
// Usage: node chat.mjs URL API_KEY OUT_DIR USER_TOKEN EXPIRED_TOKEN OTHER_TOKEN (the tokens:
// JWTs of the brain's issuer: one valid and one expired for API_KEY's team "test team" and
// its user web-user, one valid for user mallory of another team, "other team").
// Prints {"agentId","chatId","erasedChatId"} on success; any failed expectation throws (exit code 1).
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, apiKey, outDir, userToken, expiredToken, otherToken] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
const TIMEOUT = 20_000;

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
});
const problems = [];
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  // A CSP violation or an uncaught error is a failure, not noise.
  page.on("console", (m) => {
    if (m.type() === "error" && !/Failed to load resource/.test(m.text())) problems.push(m.text());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));

  const shot = (name) => page.screenshot({ path: `${outDir}/${name}.png`, fullPage: true });
  // axe-core is evaluated through the DevTools protocol, so the page's CSP stays in force.
  async function accessible(screen, on = page) {
    await on.evaluate(axeSource);
    const result = await on.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
    const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
    if (bad.length) {
      throw new Error(
        `${screen}: accessibility violations: ${bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target).join(", ")}`).join("; ")}`,
      );
    }
  }

  // Sign in: a wrong key is refused with a message, the real one gets in.
  await page.goto(url);
  await accessible("sign-in");
  await shot("1-sign-in");
  await page.getByLabel("API key or frontend token").fill("ar_not_a_key");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "The key or token was refused" }).waitFor();
  await page.getByLabel("API key or frontend token").fill(apiKey);
  await page.getByRole("button", { name: "Sign in" }).click();
  // The page says who is signed in: the team, and an API key rather than a user.
  await page.locator(".signed-in", { hasText: "test team" }).filter({ hasText: "API key" }).waitFor();

  // Create an agent, open a new chat.
  await page.getByRole("button", { name: "New agent" }).click();
  await page.getByLabel("Name", { exact: true }).fill("helper");
  await page.getByLabel("Model").fill("openai/gpt-test");
  await page.getByLabel("Runtime profile (hands)").selectOption("light");
  await accessible("new agent");
  await page.getByRole("button", { name: "Create agent" }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  const composer = page.getByLabel("Message", { exact: true });
  await composer.waitFor();

  // A reply streams in: its first words are on screen before the last ones arrive.
  await composer.fill("Hello there");
  await page.getByRole("button", { name: "Send" }).click();
  const assistant = page.locator(".message.assistant");
  await assistant.first().getByText("Hello!", { exact: false }).waitFor();
  const early = await assistant.first().innerText();
  if (early.includes("all done")) throw new Error(`the reply arrived whole, not streamed: ${early}`);
  await assistant.first().getByText("all done").waitFor();
  // Markdown is rendered, raw HTML from the model is shown as text.
  await assistant.first().locator("strong", { hasText: "streaming" }).waitFor();
  if ((await page.locator(".md img").count()) !== 0) throw new Error("the model's <img> became an element");
  await assistant.first().getByText("<img src=x onerror=alert(1)>").waitFor();

  // Hands: the first shell call starts a worker; its output shows live, then the result.
  await composer.fill("Run a loop");
  await page.getByRole("button", { name: "Send" }).click();
  const shell = page.locator("details.tool").first();
  await shell.locator(".tool-name", { hasText: "shell" }).waitFor();
  await page.locator(".message.assistant .status", { hasText: "Worker:" }).first().waitFor();
  await shell.locator(".tool-log", { hasText: "line1" }).waitFor({ timeout: 60_000 });
  await shell.locator(".tool-log", { hasText: "line3" }).waitFor();
  await shell.locator(".tool-state", { hasText: "done" }).waitFor();
  await shell.locator(".tool-output", { hasText: "line3" }).waitFor();
  // The image it wrote, uploaded: shown inline from the artifact's bytes.
  const upload = page.locator("details.tool").nth(1);
  await upload.locator(".tool-name", { hasText: "upload_artifact" }).waitFor();
  const image = upload.locator(".artifact img");
  await image.waitFor();
  await page.waitForFunction((img) => img.complete && img.naturalWidth === 1, await image.elementHandle());
  await upload.getByRole("link", { name: "Download dot.png" }).waitFor();
  await assistant.nth(1).getByText("Ran it.").waitFor();

  // A brain tool call: a card with its input and its result.
  await composer.fill("Remember that the sky is blue");
  await page.getByRole("button", { name: "Send" }).click();
  const card = page.locator("details.tool").nth(2);
  await card.locator(".tool-name", { hasText: "memory_write" }).waitFor();
  await card.locator(".tool-input", { hasText: "the sky is blue" }).waitFor();
  await card.locator(".tool-state", { hasText: "done" }).waitFor();
  await card.locator(".tool-output").waitFor();
  await assistant.nth(2).getByText("Noted.").waitFor();
  await accessible("chat");
  await shot("2-chat");

  // A slow turn. While it streams a message may wait its turn (T13): it shows as queued.
  await composer.fill("Count slowly");
  await page.getByRole("button", { name: "Send" }).click();
  await assistant.nth(3).getByText("one", { exact: false }).waitFor();
  await composer.fill("Then wave");
  await page.getByRole("button", { name: "Queue" }).click();
  await page.getByText("Queued: it runs when the agent is free.").waitFor();
  await accessible("queued");
  await shot("3-queued");
  // "Stop and send": the slow turn is interrupted (its text kept), the new one streams.
  await composer.fill("Say hi instead");
  await page.getByRole("button", { name: "Stop and send" }).click();
  await assistant.nth(3).getByText("Interrupted").waitFor();
  await page.getByText("Hi there.").waitFor();
  // Then the queued message runs, and the transcript puts it after the answer before it.
  await page.getByText("Waved.").waitFor();
  await page.getByText("Queued: it runs when the agent is free.").waitFor({ state: "detached" });
  await page.getByRole("button", { name: "Send" }).waitFor();
  const order = await page.locator(".message").evaluateAll((all) => all.slice(-6).map((m) => m.textContent));
  const expected = ["Count slowly", "one", "Say hi instead", "Hi there.", "Then wave", "Waved."];
  expected.forEach((text, i) => {
    if (!order[i]?.includes(text)) throw new Error(`message ${i} of the queue's end is not "${text}": ${order}`);
  });
  await shot("3-stopped");

  // A reload shows the same transcript, from the store (less the live output and status
  // lines, which only the stream carries: the stored result has the whole text).
  const transcript = () =>
    page.evaluate(() => {
      const copy = document.querySelector(".messages").cloneNode(true);
      copy.querySelectorAll(".live, .status, .notice").forEach((e) => e.remove());
      return copy.textContent;
    });
  const before = await transcript();
  await page.reload();
  await assistant.nth(3).getByText("Interrupted").waitFor();
  await page.getByRole("link", { name: "Download dot.png" }).waitFor();
  const after = await transcript();
  if (after !== before) throw new Error(`the transcript changed on reload:\n${before}\n---\n${after}`);

  // A refused turn says what happened and what to do.
  await composer.fill("Are you there?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.getByRole("alert").filter({ hasText: "rate_limited" }).filter({ hasText: "Wait a moment" }).waitFor();
  await page.getByRole("button", { name: "Send" }).waitFor({ state: "attached" });
  await shot("4-error");

  // A second tab on the same chat follows a turn the first one runs, live, through the
  // events stream (its worker's output too); a message sent there meanwhile is refused as
  // agent_busy. A third tab opened mid-turn picks the turn up from its start.
  const tab2 = await context.newPage();
  tab2.setDefaultTimeout(TIMEOUT);
  tab2.on("pageerror", (e) => problems.push(`tab 2 page error: ${e.message}`));
  await tab2.goto(url);
  await tab2.getByLabel("API key or frontend token").fill(apiKey);
  await tab2.getByRole("button", { name: "Sign in" }).click();
  await tab2.getByRole("button", { name: "Sign out" }).waitFor();
  // The chat's address differs only in its hash: reloaded to open it.
  await tab2.goto(page.url());
  await tab2.reload();
  await tab2.locator(".message.assistant").nth(3).getByText("Interrupted").waitFor();
  await tab2.waitForTimeout(500); // its events stream connects
  await composer.fill("Watch this");
  await page.getByRole("button", { name: "Send" }).click();
  const followed = tab2.locator(".message.assistant").nth(6);
  await followed.locator(".tool-log", { hasText: "tick2" }).waitFor();
  const ticking = await followed.innerText();
  if (ticking.includes("tick4")) throw new Error(`tab 2 saw the command only once it ended: ${ticking}`);
  await followed.getByText("watch2", { exact: false }).waitFor();
  const partial = await followed.innerText();
  if (partial.includes("watch9")) throw new Error(`tab 2 saw the turn only once it ended: ${partial}`);
  // Signed in by the address (`#token=`, which leaves it at once) straight into the chat.
  const tab3 = await context.newPage();
  tab3.setDefaultTimeout(TIMEOUT);
  tab3.on("pageerror", (e) => problems.push(`tab 3 page error: ${e.message}`));
  await tab3.goto(`${url}/#token=${encodeURIComponent(apiKey)}&chat=${new URL(page.url()).hash.slice(1)}`);
  const resumed = tab3.locator(".message.assistant").nth(6);
  await resumed.locator(".tool-output", { hasText: "tick4" }).waitFor();
  await resumed.getByText("watch", { exact: false }).first().waitFor();
  const joined = await resumed.innerText();
  if (joined.includes("watch9")) throw new Error(`tab 3 saw the turn only once it ended: ${joined}`);
  if (tab3.url().includes("token")) throw new Error(`the token stayed in the address: ${tab3.url()}`);
  await tab3.getByRole("button", { name: "Stop", exact: true }).waitFor();
  await tab2.getByLabel("Message", { exact: true }).fill("Are you busy?");
  await tab2.getByRole("button", { name: "Send" }).click();
  await tab2.getByRole("alert").filter({ hasText: "agent_busy" }).filter({ hasText: "already running a turn" }).waitFor();
  await followed.getByText("watch9", { exact: false }).waitFor();
  await tab2.screenshot({ path: `${outDir}/4-second-tab.png`, fullPage: true });
  await resumed.getByText("watch9", { exact: false }).waitFor();
  await tab3.getByRole("button", { name: "Send" }).waitFor();
  await tab3.screenshot({ path: `${outDir}/4-third-tab.png`, fullPage: true });
  await assistant.nth(6).getByText("watch9", { exact: false }).waitFor();
  await page.getByRole("button", { name: "Send" }).waitFor();
  await tab2.close();
  await tab3.close();

  // An agent whose policy asks before memory_write (created by the test): the call waits
  // with Approve/Deny buttons; approving runs it and the turn goes on, denying tells the
  // model so. Its connector is down, which each turn says plainly.
  const firstChat = new URL(page.url()).hash;
  await page.getByRole("button", { name: /^careful/ }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  await composer.fill("Remember this, carefully");
  await page.getByRole("button", { name: "Send" }).click();
  const asking = page.locator("details.tool.approval-requested");
  await asking.locator(".tool-name", { hasText: "memory_write" }).waitFor();
  await page.locator(".status.connector", { hasText: "Connector tracker: down" }).first().waitFor();
  await accessible("approval");
  await asking.getByRole("button", { name: "Approve" }).click();
  await page.locator("details.tool .tool-state", { hasText: "done" }).waitFor();
  await page.locator(".message.assistant").getByText("Saved.").waitFor();
  await composer.fill("And this one too");
  await page.getByRole("button", { name: "Send" }).click();
  await asking.getByRole("button", { name: "Deny" }).click();
  await page.locator("details.tool .tool-state", { hasText: "denied" }).waitFor();
  await page.locator(".message.assistant").getByText("Not saved.").waitFor();
  // A person names the chat (T17): the list shows the title instead of a timestamp.
  await page.getByRole("button", { name: "Rename chat" }).click();
  const rename = page.getByRole("form", { name: "Rename chat" });
  await rename.getByLabel("Chat title").fill("  Careful notes  ");
  await accessible("rename");
  await rename.getByRole("button", { name: "Save" }).click();
  await page.getByRole("button", { name: "Careful notes", exact: true }).waitFor();
  // Deleting that chat (L2) takes it off the list and closes it.
  const erasedChatId = new URL(page.url()).hash.slice(1).split("/")[1];
  page.once("dialog", (dialog) => dialog.accept());
  await page.getByRole("button", { name: "Delete chat" }).click();
  await page.getByText("Open a chat or start a new one.").waitFor();
  if ((await page.getByRole("button", { name: "Delete chat" }).count()) !== 0) {
    throw new Error("the deleted chat is still listed");
  }
  // Back to the first chat (a new address only in its hash: reloaded to open it).
  await page.goto(`${url}/${firstChat}`);
  await page.reload();
  await assistant.nth(6).getByText("watch9", { exact: false }).waitFor();

  // With nothing scripted, the offline demo model answers: a plain request runs a real
  // command in the worker, and the demo quotes its result.
  await composer.fill("run `echo demo-hands`");
  await page.getByRole("button", { name: "Send" }).click();
  const demo = page.locator("details.tool").nth(4);
  await demo.locator(".tool-output", { hasText: "demo-hands" }).waitFor();
  await assistant.nth(7).getByText("Offline demo model: shell answered", { exact: false }).waitFor();

  // A browser agent, offline demo model: a real Chromium in the worker opens a page, and
  // its screenshot, stored as an artifact, shows inline.
  await page.getByRole("button", { name: "New agent" }).click();
  // The model field suggests the team's catalog (T16, `GET /v1/models`).
  await page.locator("#agent-models option[value^='openai/']").first().waitFor({ state: "attached" });
  await page.getByLabel("Name", { exact: true }).fill("surfer");
  await page.getByLabel("Model").fill("openai/gpt-test");
  await page.getByLabel("Runtime profile (hands)").selectOption("browser");
  await page.getByRole("button", { name: "Create agent" }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  await composer.fill(`screenshot ${url}/healthz`);
  await page.getByRole("button", { name: "Send" }).click();
  const shotCard = page.locator("details.tool", { has: page.locator(".tool-name", { hasText: "browser_screenshot" }) });
  const screenshot = shotCard.locator(".artifact img");
  await screenshot.waitFor({ timeout: 90_000 });
  await page.waitForFunction((img) => img.complete && img.naturalWidth > 100, await screenshot.elementHandle());
  await page.locator(".message.assistant").getByText("Offline demo model", { exact: false }).last().waitFor();
  await shot("6-screenshot");

  // A team quota refuses the next turn, and the page says what to do.
  const quota = await fetch(`${url}/v1/quotas`, {
    method: "PUT",
    headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ turns_per_minute: 0 }),
  });
  if (!quota.ok) throw new Error(`setting the quota: ${quota.status} ${await quota.text()}`);
  await composer.fill("One more?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.getByRole("alert").filter({ hasText: "quota_exceeded" }).filter({ hasText: "ask an admin" }).waitFor();

  // Phone width: the chat is usable, nothing wider than the screen.
  await page.setViewportSize({ width: 390, height: 780 });
  await composer.waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (overflow > 0) throw new Error(`the page is ${overflow}px wider than a phone`);
  await accessible("phone");
  await shot("5-phone");

  // A frontend token of the brain's issuer, handed over in the address of a tab with no
  // credential: signed in as its user, and the page says who that is.
  const viaToken = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const user = await viaToken.newPage();
  user.setDefaultTimeout(TIMEOUT);
  user.on("pageerror", (e) => problems.push(`token page error: ${e.message}`));
  const held = () => user.evaluate(() => sessionStorage.getItem("agent-runtime.key"));
  await user.goto(`${url}/#token=${userToken}`);
  await user.getByRole("button", { name: "Sign out" }).waitFor();
  await user.locator(".signed-in", { hasText: "test team" }).filter({ hasText: "web-user" }).waitFor();
  await user.getByRole("button", { name: /^helper/ }).click();
  await user.getByRole("button", { name: "New chat" }).waitFor();
  if (user.url().includes("token")) throw new Error(`the token stayed in the address: ${user.url()}`);

  // Login CSRF: a link carrying another team's token does not replace the tab's credential
  // without asking. The page shows who the tab is signed in as and who the link would make
  // it; keeping the sign-in changes nothing. (A new address only in its hash: reloaded.)
  const offer = async (token) => {
    await user.goto(`${url}/#token=${token}`);
    await user.reload();
    await user.getByRole("heading", { name: "Switch accounts?" }).waitFor();
    if (user.url().includes("token")) throw new Error(`the token stayed in the address: ${user.url()}`);
    if ((await held()) === token) throw new Error("the link's token was stored before the person agreed");
    return user.locator(".switch");
  };
  let asked = await offer(otherToken);
  for (const who of ["test team", "web-user", "other team", "mallory"]) {
    await asked.getByText(who, { exact: false }).first().waitFor();
  }
  if ((await user.getByRole("button", { name: "Sign out" }).count()) !== 0) {
    throw new Error("the workspace showed before the person answered");
  }
  await accessible("switch accounts", user);
  await user.screenshot({ path: `${outDir}/7-switch-accounts.png`, fullPage: true });
  await user.getByRole("button", { name: "Keep current sign-in" }).click();
  await user.locator(".signed-in", { hasText: "test team" }).filter({ hasText: "web-user" }).waitFor();
  if ((await held()) !== userToken) throw new Error("keeping the sign-in changed the credential");

  // With the person's consent the link switches the tab to the other team and its user.
  asked = await offer(otherToken);
  await user.getByRole("button", { name: "Switch account" }).click();
  await user.locator(".signed-in", { hasText: "other team" }).filter({ hasText: "mallory" }).waitFor();
  if ((await held()) !== otherToken) throw new Error("switching did not take the link's token");

  // A link whose token is refused (expired) says so and leaves the sign-in as it is.
  asked = await offer(expiredToken);
  await asked.getByRole("alert").filter({ hasText: "The link's token was refused" }).waitFor();
  if ((await user.getByRole("button", { name: "Switch account" }).count()) !== 0) {
    throw new Error("a refused token was offered as an account to switch to");
  }
  await user.getByRole("button", { name: "Keep current sign-in" }).click();
  await user.locator(".signed-in", { hasText: "other team" }).waitFor();
  await viaToken.close();

  // An expired token in a tab with no credential: back to sign-in with a message that
  // says so.
  const late = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const expired = await late.newPage();
  expired.setDefaultTimeout(TIMEOUT);
  expired.on("pageerror", (e) => problems.push(`expired token page error: ${e.message}`));
  await expired.goto(`${url}/#token=${expiredToken}`);
  await expired.getByRole("alert").filter({ hasText: "expired or was revoked" }).waitFor();
  await expired.getByLabel("API key or frontend token").waitFor();
  await late.close();

  if (problems.length) throw new Error(`console errors: ${problems.join(" | ")}`);
  const [agentId, chatId] = firstChat.slice(1).split("/");
  process.stdout.write(JSON.stringify({ agentId, chatId, erasedChatId }));
} catch (e) {
  // What the first tab showed when it failed, for the test's report.
  for (const open of browser.contexts().flatMap((c) => c.pages())) {
    const text = await open.evaluate(() => document.body.innerText).catch(() => "(closed)");
    process.stderr.write(`--- ${open.url()}\n${text}\n`);
  }
  throw e;
} finally {
  await browser.close();
}
