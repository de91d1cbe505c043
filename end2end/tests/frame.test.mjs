// The portal's frame where a page is refused or missing, in headless Chromium with JavaScript off
// (issue 37, items 3, 9 and 2): an unknown URL gets the 404 page inside the frame (navigation for
// a signed-in user, the way to sign in for a visitor), a trailing slash is redirected to the page
// without it; a read-only member whose /models form is refused is sent back to /models (frame,
// navigation, the reason) while any other client gets the 403 as JSON; /models shows no engine
// names and its buttons stay inside the card at 1280 px. Screenshots: not-found.png,
// not-found-visitor.png, models-read-only.png, models-1280.png in TF_SCREENSHOT_DIR.
//
// Needs a running portal and a tenant owner: TF_BASE_URL, TF_EMAIL, TF_PASSWORD (as tenant.test.mjs).

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

async function signedIn(who = email, pass = password) {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false });
  const page = await context.newPage();
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto("/login");
  await page.fill('input[name="email"]', who);
  await page.fill('input[name="password"]', pass);
  await Promise.all([page.waitForURL((u) => u.pathname === "/"), page.click('button[type="submit"]')]);
  return { context, page };
}

test("an unknown URL gets the 404 page inside the frame; a trailing slash is redirected", async () => {
  const { context, page } = await signedIn();
  try {
    for (const path of ["/no-such-page", "/keys/nope/deeper"]) {
      const res = await page.goto(path);
      assert.equal(res.status(), 404, path);
      assert.match(await page.textContent("main h1"), /Not found/);
      const nav = await page.textContent("header.topbar nav");
      assert.match(nav, /Keys/, "the tenant's navigation is there");
      assert.match(nav, /Usage/);
    }
    await page.screenshot({ path: join(shots, "not-found.png"), fullPage: true });

    const res = await page.goto("/usage/?range=7d");
    assert.equal(res.status(), 200);
    assert.equal(new URL(page.url()).pathname, "/usage");
    assert.equal(new URL(page.url()).search, "?range=7d", "the query survives the redirect");
    assert.match(await page.textContent("main h1"), /Usage/);
    const direct = await context.request.get("/usage/", { maxRedirects: 0 });
    assert.equal(direct.status(), 308);
    assert.equal(direct.headers()["location"], "/usage");
  } finally {
    await context.close();
  }

  const visitor = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await visitor.newPage();
    await page.setViewportSize({ width: 1280, height: 900 });
    const res = await page.goto("/nowhere");
    assert.equal(res.status(), 404);
    assert.match(await page.textContent("main h1"), /Not found/);
    assert.equal(await page.getAttribute("main a.button", "href"), "/login");
    await page.screenshot({ path: join(shots, "not-found-visitor.png"), fullPage: true });
  } finally {
    await visitor.close();
  }
});

test("a read-only member refused on /models gets the frame; other clients get JSON", async () => {
  const { context, page } = await signedIn();
  const reader = `e2e-ro-${Date.now()}@example.com`;
  const readerPassword = "read-only-password-1";
  let other;
  try {
    await page.goto("/members");
    await page.fill('input[name="email"]', reader);
    await page.selectOption("#invite-role", "read_only");
    await Promise.all([
      page.waitForURL((u) => u.pathname === "/members"),
      page.click('form[action="/api/invite_member"] button[type="submit"]'),
    ]);
    const link = (await page.textContent("#invite-link")).trim();

    other = await browser.newContext({ baseURL, javaScriptEnabled: false });
    const ro = await other.newPage();
    await ro.setViewportSize({ width: 1280, height: 900 });
    await ro.goto(link);
    await ro.fill("#password", readerPassword);
    await ro.fill("#confirm", readerPassword);
    await Promise.all([
      ro.waitForURL((u) => !u.pathname.startsWith("/invite")),
      ro.click('button[type="submit"]'),
    ]);

    await ro.goto("/models");
    const csrf = await ro.getAttribute('header.topbar input[name="csrf"]', "value");
    // A browser's own post (as a stale page's button would send it).
    const res = await other.request.post("/models/anything/start", {
      form: { csrf, confirm: "yes" },
      headers: { accept: "text/html,application/xhtml+xml,*/*;q=0.8" },
      maxRedirects: 0,
    });
    assert.equal(res.status(), 303);
    assert.equal(res.headers()["location"], "/models");
    await ro.goto("/models");
    assert.match(await ro.textContent(".flash"), /read-only/);
    assert.match(await ro.textContent("header.topbar nav"), /Keys/, "navigation kept");
    await ro.screenshot({ path: join(shots, "models-read-only.png"), fullPage: true });

    // Anything else gets the refusal as JSON.
    const api = await other.request.post("/models/anything/start", {
      form: { csrf, confirm: "yes" },
      headers: { accept: "*/*" },
      maxRedirects: 0,
    });
    assert.equal(api.status(), 403);
    assert.match((await api.json()).error, /read-only/);
  } finally {
    await other?.close();
    await context.close();
  }
});

test("/models shows no engine names and keeps its buttons inside the card at 1280 px", async () => {
  const { context, page } = await signedIn();
  try {
    await page.goto("/models");
    assert.doesNotMatch(await page.textContent("main"), /Engine name/);
    const main = await page.locator("main").boundingBox();
    for (const table of await page.locator("main table").all()) {
      const box = await table.boundingBox();
      assert.ok(box.x + box.width <= main.x + main.width + 1, "a table spills out of the page");
    }
    await page.screenshot({ path: join(shots, "models-1280.png"), fullPage: true });
  } finally {
    await context.close();
  }
});
