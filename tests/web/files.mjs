// T26 in the page: a person attaches a real PNG through the composer's file input
// (playwright's setInputFiles, which finds the input again at each call), sees its
// thumbnail, and a file too large for the brain shows its refusal beside it; a CSV dropped
// on the chat shows as a chip and is removed again. Sent, the message shows the image
// inline from its signed URL (loaded without the key), and so does the transcript after a
// reload. Prints {"chatId"} for the Rust side, which checks what the model received.
// Usage: node files.mjs URL API_KEY AGENT_NAME PNG_PATH BIG_PATH OUT_DIR
import { readFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [url, key, agent, pngPath, bigPath, outDir] = process.argv.slice(2);
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

  // The file input, with real files on disk. A node id taken once goes stale when the
  // composer re-renders for the new chat, so the locator resolves the input at each call.
  const input = page.locator("#composer-files");
  await input.setInputFiles(pngPath);
  const pending = page.locator(".pending-files");
  const thumb = pending.locator("img.thumb");
  await thumb.waitFor();
  if ((await thumb.evaluate((img) => img.naturalWidth)) !== 16) throw new Error("the thumbnail is not the picture");
  await pending.locator(".pending-file.ready").waitFor();

  await input.setInputFiles(bigPath);
  const refused = pending.locator(".pending-file.refused");
  await refused.waitFor();
  const reason = await refused.innerText();
  if (!reason.includes("file_too_large") || !reason.includes("too large")) throw new Error(`the refusal says: ${reason}`);

  // A CSV dropped on the chat shows as a chip; removed, it is gone.
  await page.evaluate(() => {
    const dt = new DataTransfer();
    dt.items.add(new File(["city,visits\nLyon,3\n"], "notes.csv", { type: "text/csv" }));
    const chat = document.querySelector("section.chat");
    chat.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true }));
    chat.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
  });
  const chip = pending.locator(".pending-file", { hasText: "notes.csv" });
  await chip.locator(".chip").waitFor();
  await page.locator(".pending-file.ready", { hasText: "notes.csv" }).waitFor();

  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const bad = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  if (bad.length) throw new Error(`accessibility: ${bad.map((v) => `${v.id}: ${v.nodes.map((n) => n.target).join(", ")}`).join("; ")}`);
  await page.screenshot({ path: `${outDir}/files-attached.png`, fullPage: true });

  await page.getByRole("button", { name: "Remove notes.csv" }).click();
  await chip.waitFor({ state: "detached" });

  await page.getByLabel("Message", { exact: true }).fill("What is in this picture?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator(".message.assistant").getByText("A red square.").waitFor();
  if ((await pending.count()) !== 0) throw new Error("the attachments stayed after sending");

  // The transcript's image, from its signed URL: an <img> sends no key.
  const shown = async () => {
    const img = page.locator(".message.user figure.file img").first();
    await img.waitFor();
    await page.waitForFunction((el) => el.complete && el.naturalWidth > 0, await img.elementHandle());
    const src = await img.getAttribute("src");
    if (!/^\/v1\/files\/[0-9a-f-]{36}\?exp=\d+&sig=[A-Za-z0-9_-]+$/.test(src)) throw new Error(`not a signed URL: ${src}`);
    return img.evaluate((el) => el.naturalWidth);
  };
  if ((await shown()) !== 16) throw new Error("the sent image does not show");
  if ((await page.locator(".message.user").getByText("notes.csv").count()) !== 0) throw new Error("the removed file was sent");
  await page.screenshot({ path: `${outDir}/files-sent.png`, fullPage: true });

  await page.reload();
  if ((await shown()) !== 16) throw new Error("the image does not show after a reload");
  await page.screenshot({ path: `${outDir}/files-reloaded.png`, fullPage: true });
  if (problems.length) throw new Error(problems.join("\n"));
  const chatId = new URL(page.url()).hash.split("/")[1];
  console.log(JSON.stringify({ chatId }));
} finally {
  await browser.close();
}
