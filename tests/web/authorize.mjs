// B2 in the page: a turn finds its connector needs authorization; the person
// clicks "Authorize", which POSTs the turn's flow link with the page's key (the answer's
// cookie binds the flow to this browser) and opens the authorization server's page in a
// new tab; its redirect back to the brain's callback, in this browser, finishes the flow.
// Usage: node authorize.mjs URL API_KEY AGENT_NAME OUT_DIR
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, key, agent, outDir] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const problems = [];
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(60_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.goto(url);
  await page.getByLabel("API key or frontend token").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: new RegExp(`^${agent}`) }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Message", { exact: true }).fill("hello");
  await page.getByRole("button", { name: "Send" }).click();

  const button = page.getByRole("button", { name: "Authorize everything" });
  await button.waitFor();
  const [tab] = await Promise.all([context.waitForEvent("page"), button.click()]);
  tab.setDefaultTimeout(60_000);
  await tab.waitForURL(/\/v1\/oauth\/callback\?/);
  await tab.getByRole("heading", { name: "Connected" }).waitFor();
  await tab.screenshot({ path: `${outDir}/authorized.png` });
  const cookies = await context.cookies();
  const flow = cookies.find((c) => c.name.startsWith("ar_oauth_"));
  if (!flow) throw new Error("the flow's cookie was not kept");
  if (!flow.httpOnly || flow.sameSite !== "Lax" || flow.path !== "/v1/oauth/callback") {
    throw new Error(`the flow's cookie: ${JSON.stringify(flow)}`);
  }
  if (problems.length) throw new Error(problems.join("\n"));
} finally {
  await browser.close();
}
