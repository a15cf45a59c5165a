// M4 in the page: a person opens "What the agent remembers about you" under an agent's
// chats, sees the agent's memories and deletes one; the panel then lists the rest, and
// axe finds no violation in it.
// Usage: node memories.mjs URL API_KEY AGENT_NAME FORGOTTEN KEPT
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, key, agent, forgotten, kept] = process.argv.slice(2);
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
  await page.getByText("What the agent remembers about you").click();
  const panel = page.locator("details.memories");
  const note = panel.locator("li", { hasText: forgotten });
  await note.waitFor();
  await panel.locator("li", { hasText: kept }).waitFor();
  await note.getByRole("button", { name: "Delete memory" }).click();
  await note.waitFor({ state: "detached" });
  await panel.locator("li", { hasText: kept }).waitFor();

  await page.evaluate(axeSource);
  const result = await page.evaluate(() =>
    window.axe.run(document.querySelector("details.memories"), { resultTypes: ["violations"] }),
  );
  for (const v of result.violations) problems.push(`axe: ${v.id}: ${v.help}`);
} finally {
  await browser.close();
}
if (problems.length > 0) {
  console.error(problems.join("\n"));
  process.exit(1);
}
