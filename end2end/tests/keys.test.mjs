// The tenant console's keys page and home in headless Chromium with JavaScript off: create a key,
// see its secret once, call the API with it, revoke it and see the API refuse it; screenshots of
// `/keys` and `/` go to TF_SCREENSHOT_DIR (default end2end/screenshots), kept as CI artefacts.
// With JavaScript on, the copy button appears next to a new secret.
//
// Needs a running portal and a tenant member: TF_BASE_URL, TF_EMAIL, TF_PASSWORD (as login.test.mjs).

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

async function signIn(context) {
  const page = await context.newPage();
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto("/login");
  await page.fill('input[name="email"]', email);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForURL((u) => u.pathname === "/"), page.click('button[type="submit"]')]);
  return page;
}

async function createKey(page, name) {
  await page.goto("/keys");
  await page.fill('input[name="name"]', name);
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/keys"),
    page.click('form[action="/api/create_key"] button[type="submit"]'),
  ]);
  return (await page.textContent("#new-key-secret")).trim();
}

async function api(key, path, body) {
  const res = await fetch(`${baseURL}${path}`, {
    method: body ? "POST" : "GET",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: res.status, json: await res.json().catch(() => null) };
}

test("create a key, use it, revoke it (JavaScript off)", async () => {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await signIn(context);
    const name = `e2e key ${Date.now()}`;
    const secret = await createKey(page, name);
    assert.match(secret, /^tf-[A-Za-z0-9_-]{43}$/);
    assert.match(await page.textContent("body"), /Copy it now: it will not be shown again\./);
    // No JavaScript, no copy button: the secret is selectable text.
    assert.equal(await page.locator("button[data-copy]").isVisible(), false);
    await page.screenshot({ path: join(shots, "keys-new-secret.png"), fullPage: true });

    // The key works on the API.
    const models = await api(secret, "/v1/models");
    assert.equal(models.status, 200);
    // A chat model: the demo's embedding base (bge-small-sim) answers chat with 400.
    const model = models.json.data.map((m) => m.id).find((id) => !id.startsWith("bge-"));
    const chat = await api(secret, "/v1/chat/completions", {
      model, max_tokens: 4, messages: [{ role: "user", content: "Hello from the keys page test" }],
    });
    assert.equal(chat.status, 200, JSON.stringify(chat.json));

    // Shown once: a reload lists the key by its prefix only.
    await page.goto("/keys");
    assert.equal(await page.locator("#new-key-secret").count(), 0);
    const row = page.locator("tr", { hasText: name });
    assert.equal(await row.count(), 1);
    assert.match(await row.textContent(), new RegExp(`${secret.slice(0, 11)}`));
    assert.doesNotMatch(await page.content(), new RegExp(secret.slice(11)));

    // Revoke it through its confirmation.
    await row.locator("summary", { hasText: "Revoke" }).click();
    await Promise.all([
      page.waitForURL((u) => u.pathname === "/keys"),
      row.locator('button[type="submit"]', { hasText: "Revoke key" }).click(),
    ]);
    assert.match(await page.textContent("body"), /Key revoked\./);
    assert.match(await page.locator("tr", { hasText: name }).textContent(), /Revoked/);
    await page.screenshot({ path: join(shots, "keys.png"), fullPage: true });

    // The API refuses it within a second or so.
    const revokedAt = Date.now();
    let status;
    do {
      status = (await api(secret, "/v1/models")).status;
      if (status === 401) break;
      await new Promise((r) => setTimeout(r, 50));
    } while (Date.now() - revokedAt < 2000);
    assert.equal(status, 401);

    // The home: the tenant's figures, models and the quick start.
    await page.goto("/");
    const home = await page.textContent("main");
    assert.match(home, /This month/);
    assert.match(home, /Models you can use/);
    assert.match(home, new RegExp(model.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")));
    assert.match(home, /Bearer YOUR_KEY/);
    assert.match(await page.textContent("#stat-requests"), /^[0-9,]+$/);
    await page.screenshot({ path: join(shots, "home.png"), fullPage: true });
  } finally {
    await context.close();
  }
});

test("the copy button appears where JavaScript runs", async () => {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: true });
  try {
    const page = await signIn(context);
    const name = `e2e js key ${Date.now()}`;
    const secret = await createKey(page, name);
    assert.match(secret, /^tf-/);
    assert.equal(await page.locator("button[data-copy]").isVisible(), true);

    // Rotate it with the default grace period: a new key, shown once; the old one works on.
    const row = page.locator("tr", { hasText: name });
    await row.locator("summary", { hasText: "Rotate" }).click();
    await page.screenshot({ path: join(shots, "keys-rotate-confirm.png"), fullPage: true });
    await Promise.all([
      page.waitForURL((u) => u.pathname === "/keys"),
      row.locator('button[type="submit"]', { hasText: "Rotate key" }).click(),
    ]);
    const rotated = (await page.textContent("#new-key-secret")).trim();
    assert.notEqual(rotated, secret);
    assert.match(await page.textContent("body"), /The old key works until /);
    assert.equal((await api(secret, "/v1/models")).status, 200);
    assert.equal((await api(rotated, "/v1/models")).status, 200);
    await page.screenshot({ path: join(shots, "keys-rotated.png"), fullPage: true });
  } finally {
    await context.close();
  }
});
