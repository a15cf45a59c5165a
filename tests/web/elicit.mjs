// P5 in the page: an MCP server (server-everything's `trigger-elicitation-request`) asks a
// question while its tool call waits; the page shows the form pre-filled with the
// schema's defaults, the person fills in a field and sends it, and the tool's result
// echoes the values. Usage: node elicit.mjs URL API_KEY AGENT_NAME OUT_DIR
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, key, agent, outDir] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const problems = [];
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  page.setDefaultTimeout(60_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.goto(url);
  await page.getByLabel("API key or frontend token").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: new RegExp(`^${agent}`) }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Message", { exact: true }).fill("ask me");
  await page.getByRole("button", { name: "Send" }).click();

  const form = page.locator("form.elicitation");
  await form.getByText("Please provide inputs for the following fields:").waitFor();
  // Pre-filled from the schema's defaults (SEP-1034).
  const firstLine = form.locator('input[id$="-firstLine"]');
  if ((await firstLine.inputValue()) !== "It was a dark and stormy night.") {
    throw new Error(`the default is not pre-filled: ${await firstLine.inputValue()}`);
  }
  const integer = form.locator('input[id$="-integer"]');
  if ((await integer.inputValue()) !== "42") throw new Error(`integer: ${await integer.inputValue()}`);
  // Titled choices show their titles, single and multiple.
  await form.locator('select[id$="-titledSingleSelectEnum"] option', { hasText: "Superman" }).waitFor({ state: "attached" });
  await form.locator('select[id$="-titledMultipleSelectEnum"] option', { hasText: "Tuna" }).waitFor({ state: "attached" });
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  if (bad.length) throw new Error(`accessibility: ${bad.map((v) => `${v.id}: ${v.nodes.map((n) => n.target).join(", ")}`).join("; ")}`);
  await page.screenshot({ path: `${outDir}/elicitation-form.png`, fullPage: true });

  await form.locator('input[id$="-name"]').fill("Ada Lovelace");
  await integer.fill("7");
  await form.getByRole("button", { name: "Send" }).click();
  await form.getByText("Sent.").waitFor();
  const output = page.locator("details.tool .tool-output", { hasText: "Name: Ada Lovelace" });
  await output.waitFor();
  if (!(await output.innerText()).includes("Favorite Integer: 7")) throw new Error("the values did not reach the server");
  await page.locator(".message.assistant").getByText("Done.").last().waitFor();
  await page.screenshot({ path: `${outDir}/elicitation-answered.png`, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
} finally {
  await browser.close();
}
