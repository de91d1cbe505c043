// The tenant console's people and settings pages in headless Chromium with JavaScript off: the
// owner sees /members, makes an invitation link (shown once) and withdraws it; /settings saves
// the tenant's body-logging choice (and turns it back off); /limits shows the tenant's limits;
// opted in, an API call's prompt and completion show on /logs/{request_id}, then "delete all".
// Screenshots of the three pages go to TF_SCREENSHOT_DIR (default end2end/screenshots).
//
// Needs a running portal and a tenant owner: TF_BASE_URL, TF_EMAIL, TF_PASSWORD (as login.test.mjs).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const email = process.env.TF_EMAIL;
const password = process.env.TF_PASSWORD;
const shots = process.env.TF_SCREENSHOT_DIR ?? new URL("../screenshots", import.meta.url).pathname;

let browser;

before(async () => {
  assert.ok(email && password, "set TF_EMAIL and TF_PASSWORD to a tenant owner's credentials");
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

async function signedIn() {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false });
  const page = await context.newPage();
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto("/login");
  await page.fill('input[name="email"]', email);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForURL((u) => u.pathname === "/"), page.click('button[type="submit"]')]);
  return { context, page };
}

test("an owner invites someone and withdraws the invitation (JavaScript off)", async () => {
  const { context, page } = await signedIn();
  await page.goto("/members");
  assert.match(await page.textContent("main"), new RegExp(email.replace(/[.@]/g, "\\$&")));
  const invitee = `e2e-${Date.now()}@example.com`;
  await page.fill('input[name="email"]', invitee);
  await page.selectOption("#invite-role", "read_only");
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/members"),
    page.click('form[action="/api/invite_member"] button[type="submit"]'),
  ]);
  const link = (await page.textContent("#invite-link")).trim();
  assert.match(link, /\/invite\/[0-9a-f]{64}$/);
  assert.equal(await page.getAttribute(".flash", "class"), "flash ok");
  await page.screenshot({ path: join(shots, "members.png"), fullPage: true });

  // The invitee's page shows the tenant and role.
  const other = await browser.newContext({ javaScriptEnabled: false });
  const invitePage = await other.newPage();
  await invitePage.goto(link);
  assert.match(await invitePage.textContent("main"), /Read-only/);
  await invitePage.screenshot({ path: join(shots, "invite.png"), fullPage: true });

  await Promise.all([
    page.waitForURL((u) => u.pathname === "/members"),
    page.click('form[action="/api/cancel_invitation"] button[type="submit"]'),
  ]);
  await invitePage.goto(link);
  assert.match(await invitePage.textContent("main"), /not valid/);
  await other.close();
  await context.close();
});

test("settings and limits (JavaScript off)", async () => {
  const { context, page } = await signedIn();
  await page.goto("/settings");
  await page.check('input[name="body_logging"]');
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/settings"),
    page.click('form[action="/api/save_tenant_settings"] button[type="submit"]'),
  ]);
  assert.match(await page.textContent(".flash"), /Settings saved/);
  assert.equal(await page.isChecked('input[name="body_logging"]'), true);
  await page.screenshot({ path: join(shots, "settings.png"), fullPage: true });
  await page.uncheck('input[name="body_logging"]');
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/settings"),
    page.click('form[action="/api/save_tenant_settings"] button[type="submit"]'),
  ]);
  assert.equal(await page.isChecked('input[name="body_logging"]'), false);

  await page.goto("/limits");
  assert.match(await page.textContent("main"), /Whole tenant/);
  await page.screenshot({ path: join(shots, "limits.png"), fullPage: true });
  await context.close();
});

test("models: the bases offered and the demo tenant's adapters (JavaScript off)", async () => {
  const { context, page } = await signedIn();
  await page.goto("/models");
  const main = await page.textContent("main");
  assert.match(main, /llama-3\.1-8b-sim/);
  assert.match(main, /support-bot/);
  assert.match(main, /sql-helper/);
  await page.screenshot({ path: join(shots, "models.png"), fullPage: true });
  await context.close();
});

test("opted in, an API call's prompt and completion show on its log page (JavaScript off)", async () => {
  const apiKey = process.env.TF_API_KEY;
  assert.ok(apiKey, "set TF_API_KEY to a key of the tenant");
  const { context, page } = await signedIn();
  await page.goto("/settings");
  await page.check('input[name="body_logging"]');
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/settings"),
    page.click('form[action="/api/save_tenant_settings"] button[type="submit"]'),
  ]);
  assert.equal(await page.isChecked('input[name="body_logging"]'), true);

  // The opt-in reaches the gateway within a second; a few tries cover that second.
  const prompt = `what is a <b>token</b>? e2e-${Date.now()}`;
  let requestId;
  for (let i = 0; i < 20 && !requestId; i++) {
    const res = await fetch(`${baseURL}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "llama-3.1-8b-sim", max_tokens: 8,
        messages: [{ role: "user", content: prompt }] }),
    });
    assert.equal(res.status, 200);
    const id = res.headers.get("x-request-id");
    await res.text();
    // The body and the usage event are written off the request path: wait for the page.
    for (let j = 0; j < 20; j++) {
      await page.goto(`/logs/${id}`);
      if (await page.$("#prompt-body")) { requestId = id; break; }
      if (await page.$("#no-bodies")) break;
      await page.waitForTimeout(100);
    }
  }
  assert.ok(requestId, "a request's bodies were stored");
  assert.match(await page.textContent("#prompt-body"), /what is a <b>token<\/b>\?/);
  assert.match(await page.textContent("#completion-body"), /"completion_tokens"/);
  assert.match(await page.textContent("main"), /llama-3\.1-8b-sim/);
  await page.screenshot({ path: join(shots, "log-detail.png"), fullPage: true });

  // The request log links to it.
  await page.goto("/logs");
  assert.ok(await page.$(`a[href="/logs/${requestId}"]`), "the log row links to its page");

  // Delete them all, then opt out again.
  await page.goto("/settings");
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/settings"),
    page.click('form[action="/api/delete_stored_bodies"] button[type="submit"]'),
  ]);
  assert.match(await page.textContent(".flash"), /stored request body was deleted/);
  await page.goto(`/logs/${requestId}`);
  assert.ok(await page.$("#no-bodies"), "deleted");
  await page.goto("/settings");
  await page.uncheck('input[name="body_logging"]');
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/settings"),
    page.click('form[action="/api/save_tenant_settings"] button[type="submit"]'),
  ]);
  await context.close();
});
