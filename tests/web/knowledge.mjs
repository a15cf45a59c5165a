// B5 in the page: a person asks an agent with a knowledge base; the answer, which drew on
// a passage found by knowledge_search, shows that passage's document as a citation under
// it (a source-document part), live and again after a reload (from the transcript).
// Prints {"chatId"} for the Rust side.
// Usage: node knowledge.mjs URL API_KEY AGENT_NAME QUESTION ANSWER CITATION DOCUMENT_ID OUT_DIR
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, key, agent, question, answer, citation, documentId, outDir] = process.argv.slice(2);
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
  await page.getByLabel("Message", { exact: true }).fill(question);
  await page.getByRole("button", { name: "Send" }).click();

  // The citation belongs to the answer, and names the passage the tool found.
  const cited = async () => {
    const reply = page.locator(".message.assistant", { hasText: answer });
    await reply.waitFor();
    const source = reply.locator(".source", { hasText: citation });
    await source.waitFor();
    const title = await source.getAttribute("title");
    if (!new RegExp(`^${documentId}:\\d+$`).test(title)) throw new Error(`the citation names ${title}, not a passage of ${documentId}`);
  };
  await cited();
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  if (bad.length) throw new Error(`accessibility: ${bad.map((v) => `${v.id}: ${v.nodes.map((n) => n.target).join(", ")}`).join("; ")}`);
  await page.screenshot({ path: `${outDir}/knowledge-cited.png`, fullPage: true });

  await page.reload();
  await cited();
  await page.screenshot({ path: `${outDir}/knowledge-reloaded.png`, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
  const chatId = new URL(page.url()).hash.split("/")[1];
  console.log(JSON.stringify({ chatId }));
} finally {
  await browser.close();
}
