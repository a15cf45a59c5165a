// B7, B8 in the page: a person names, in an agent's settings, the agent it may delegate to
// and the skill it uses (PATCH /v1/agents/{id}); then asks it something, and the delegate
// call's card holds a nested card of the delegated task: the delegate's name, the tool it
// called, what it wrote, and how it ended (from the stream's `data-delegation` parts).
// While the delegate still writes (its model held by the Rust side), the card shows it
// working with its text so far: the script prints `live`, and the Rust side lets the
// model go on. Prints {"chatId"} last.
// Usage: node delegation.mjs URL API_KEY LEAD DELEGATE SKILL QUESTION CHILD_TOOL CHILD_TEXT ANSWER OUT_DIR
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, key, lead, delegate, skill, question, childTool, childText, answer, outDir] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const problems = [];

async function accessible(page) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  if (bad.length) throw new Error(`accessibility: ${bad.map((v) => `${v.id}: ${v.nodes.map((n) => n.target).join(", ")}`).join("; ")}`);
}

try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  page.setDefaultTimeout(60_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.goto(url);
  await page.getByLabel("API key or frontend token").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: new RegExp(`^${lead}`) }).click();

  // The settings: the delegate ticked, the skill named, saved.
  await page.getByText("Agent settings").click();
  const settings = page.getByRole("form", { name: `Settings of ${lead}` });
  await settings.getByRole("checkbox", { name: delegate }).check();
  await settings.getByLabel("Skills (names, comma-separated)").fill(skill);
  await settings.getByRole("button", { name: "Save settings" }).click();
  await settings.getByRole("status").filter({ hasText: "Saved." }).waitFor();
  await accessible(page);
  await page.screenshot({ path: `${outDir}/delegation-settings.png`, fullPage: true });

  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Message", { exact: true }).fill(question);
  await page.getByRole("button", { name: "Send" }).click();

  // The delegate call's card holds the task's card, live while the delegate writes.
  const call = page.locator("details.tool", { has: page.locator(".tool-name", { hasText: /^delegate$/ }) });
  const task = call.getByRole("region", { name: `Delegated to ${delegate}` });
  await task.locator(".delegation-status", { hasText: "working…" }).waitFor();
  await task.locator(".delegation-text", { hasText: childText }).waitFor();
  await page.screenshot({ path: `${outDir}/delegation-live.png`, fullPage: true });
  console.log("live");

  await page.locator(".message.assistant", { hasText: answer }).waitFor();
  await task.locator(".delegation-status", { hasText: "finished" }).waitFor();
  await task.locator(".delegation-tools li", { hasText: childTool }).locator(".tool-state", { hasText: "done" }).waitFor();
  await task.locator(".delegation-text", { hasText: childText }).waitFor();
  await accessible(page);
  await page.screenshot({ path: `${outDir}/delegation-card.png`, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
  const chatId = new URL(page.url()).hash.split("/")[1];
  console.log(JSON.stringify({ chatId }));
} finally {
  await browser.close();
}
