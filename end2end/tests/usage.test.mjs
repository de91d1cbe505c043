// The tenant's /usage and /logs pages in headless Chromium with JavaScript off, after the run
// script's API calls (curl and the openai package). With TF_API_KEY set, the test makes one more
// request of its own and finds it, by its x-request-id, in the request log and in the usage
// table. Screenshots of both pages go to TF_SCREENSHOTS (default end2end/screenshots).
//
// Needs a running portal and a tenant member: TF_BASE_URL, TF_EMAIL, TF_PASSWORD, optionally
// TF_API_KEY; CHROMIUM (default /usr/bin/chromium).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const email = process.env.TF_EMAIL;
const password = process.env.TF_PASSWORD;
const apiKey = process.env.TF_API_KEY;
const shots = process.env.TF_SCREENSHOTS ?? new URL("../screenshots", import.meta.url).pathname;

let browser;

before(async () => {
  assert.ok(email && password, "set TF_EMAIL and TF_PASSWORD to a tenant member's credentials");
  mkdirSync(shots, { recursive: true });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});

after(async () => {
  await browser?.close();
});

/// Reloads `path` until `check` passes (usage is shipped from the journal within a moment).
async function eventually(page, path, check) {
  let last;
  for (let i = 0; i < 40; i++) {
    await page.goto(path);
    try {
      return await check();
    } catch (e) {
      last = e;
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  throw last;
}

const count = (text) => Number((text ?? "").replace(/[^0-9]/g, ""));

test("usage chart and table, and the request log, with JavaScript off", async () => {
  let requestId;
  if (apiKey) {
    const res = await fetch(`${baseURL}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "llama-3.1-8b-sim", max_tokens: 5,
        messages: [{ role: "user", content: "hello from the usage test" }] }),
    });
    assert.equal(res.status, 200);
    requestId = res.headers.get("x-request-id");
    assert.ok(requestId, "x-request-id");
  }

  const context = await browser.newContext({ baseURL, javaScriptEnabled: false,
    viewport: { width: 1280, height: 900 } });
  try {
    const page = await context.newPage();
    await page.goto("/login");
    await page.fill('input[name="email"]', email);
    await page.fill('input[name="password"]', password);
    await Promise.all([page.waitForURL((url) => url.pathname === "/"), page.click('button[type="submit"]')]);

    // The request log: newest first, the test's request on top once shipped.
    await page.click('nav.nav a[href="/logs"]');
    await eventually(page, "/logs", async () => {
      assert.ok((await page.locator("tr.log-row").count()) >= 1, "a request in the log");
      if (requestId) {
        const row = page.locator(`tr.log-row[data-request-id="${requestId}"]`);
        assert.equal(await row.count(), 1, "the test's request is in the log");
        assert.match(await row.textContent(), /llama-3\.1-8b-sim/);
      }
    });
    // The filter form is a GET form: filtering by status keeps only those rows.
    await page.selectOption('select[name="status"]', "ok");
    await Promise.all([page.waitForURL(/status=ok/), page.click('form.filters button[type="submit"]')]);
    const statuses = await page.locator("tr.log-row .status").allTextContents();
    assert.ok(statuses.length >= 1 && statuses.every((s) => s === "ok"), statuses.join(","));
    await page.goto("/logs");
    await page.screenshot({ path: join(shots, "logs.png"), fullPage: true });

    // Usage: the chart is drawn and the table counts the requests, today's included.
    await page.goto("/usage");
    const total = await eventually(page, "/usage?range=7", async () => {
      const n = count(await page.textContent("tr.totals td.requests"));
      assert.ok(n >= (requestId ? 3 : 1), `requests counted: ${n}`);
      return n;
    });
    assert.ok((await page.locator("figure.chart svg rect").count()) >= 1, "bars drawn");
    assert.equal(await page.locator("figure.chart svg polyline.line").count(), 1, "cost line drawn");
    const today = new Date().toISOString().slice(0, 10);
    const llama = page.locator(`tr.usage-row[data-day="${today}"][data-model="llama-3.1-8b-sim"] td.requests`);
    assert.ok(count(await llama.textContent()) >= 1, "today's llama requests");
    // The rows add up to the total.
    const rows = await page.locator("tr.usage-row td.requests").allTextContents();
    assert.equal(rows.reduce((a, t) => a + count(t), 0), total);
    // Filtering by model through the form (JS off) narrows the total.
    await page.selectOption('select[name="model"]', "support-bot");
    await Promise.all([page.waitForURL(/model=support-bot/), page.click('form.filters button[type="submit"]')]);
    const bot = count(await page.textContent("tr.totals td.requests"));
    assert.ok(bot >= 1 && bot < total, `support-bot ${bot} of ${total}`);
    await page.goto("/usage?range=7");
    await page.screenshot({ path: join(shots, "usage.png"), fullPage: true });
  } finally {
    await context.close();
  }
});
