// The first five minutes, as `make dev` prints them: open the link, sign in with the key it
// printed, pick the agent "demo", press "New chat", type what it says. The offline demo
// model runs the command in a real worker. Usage: node dev.mjs URL KEY OUT_DIR
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, key, outDir] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  page.setDefaultTimeout(60_000);
  await page.goto(url);
  await page.getByLabel("API key or frontend token").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: /^demo/ }).click();
  await page.getByRole("button", { name: "New chat" }).click();
  await page.getByLabel("Message", { exact: true }).fill("run `ls -la`");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator("details.tool .tool-name", { hasText: "shell" }).waitFor();
  await page.locator("details.tool .tool-output", { hasText: "total" }).waitFor();
  await page.locator(".message.assistant").getByText("Offline demo model", { exact: false }).last().waitFor();
  await page.screenshot({ path: `${outDir}/make-dev.png`, fullPage: true });
} finally {
  await browser.close();
}
