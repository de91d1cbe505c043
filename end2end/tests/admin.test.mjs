// The admin pages in headless Chromium with JavaScript off: an admin creates a tenant (its first
// user's password is shown once), that user signs in and makes a key that works, the admin
// suspends the tenant and the tenant's next API call gets 403, then reactivates it. Screenshots of
// every admin page go to TF_SCREENSHOT_DIR (default end2end/screenshots), kept as CI artefacts.
// A tenant user opening an admin page gets the 403 page.
//
// Needs a running portal and an admin: TF_BASE_URL, TF_ADMIN_EMAIL, TF_ADMIN_PASSWORD; and a
// tenant member (TF_EMAIL, TF_PASSWORD) for the 403 check.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const adminEmail = process.env.TF_ADMIN_EMAIL;
const adminPassword = process.env.TF_ADMIN_PASSWORD;
const shots = process.env.TF_SCREENSHOT_DIR ?? new URL("../screenshots", import.meta.url).pathname;

let browser;

before(async () => {
  assert.ok(adminEmail && adminPassword, "set TF_ADMIN_EMAIL and TF_ADMIN_PASSWORD to an admin's credentials");
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

async function signIn(context, email, password, home) {
  const page = await context.newPage();
  await page.setViewportSize({ width: 1280, height: 900 });
  await page.goto("/login");
  await page.fill('input[name="email"]', email);
  await page.fill('input[name="password"]', password);
  await Promise.all([page.waitForURL((u) => u.pathname === home), page.click('button[type="submit"]')]);
  return page;
}

async function status(key) {
  const res = await fetch(`${baseURL}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  return res.status;
}

/// Polls the API until it answers `want` (or fails after `ms`); returns how long it took.
async function until(key, want, ms) {
  const start = Date.now();
  for (;;) {
    const s = await status(key);
    if (s === want) return Date.now() - start;
    assert.ok(Date.now() - start < ms, `API still answers ${s}, wanted ${want}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("an admin suspends a tenant and its next API call gets 403 (JavaScript off)", async () => {
  const admin = await browser.newContext({ baseURL, javaScriptEnabled: false });
  const member = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await signIn(admin, adminEmail, adminPassword, "/admin");
    await page.screenshot({ path: join(shots, "admin.png"), fullPage: true });

    // Create a tenant with a first user; the password is shown once.
    const handle = `e2e-${Date.now()}`;
    const email = `owner@${handle}.test`;
    await page.goto("/admin/tenants");
    await page.fill('input[name="name"]', handle);
    await page.fill('input[name="display_name"]', "End-to-end Tenant");
    await page.fill('input[name="email"]', email);
    await Promise.all([
      page.waitForURL((u) => u.pathname === "/admin/tenants"),
      page.click('form[action="/api/admin_create_tenant"] button[type="submit"]'),
    ]);
    assert.match(await page.textContent("body"), /Tenant created\./);
    const password = (await page.textContent("#new-password")).trim();
    assert.match(password, /^[A-Za-z0-9]{16}$/);
    await page.screenshot({ path: join(shots, "admin-tenants.png"), fullPage: true });
    await page.reload();
    assert.equal(await page.locator("#new-password").count(), 0, "shown once");

    // The first user signs in and makes a key; it works.
    const tenantPage = await signIn(member, email, password, "/");
    await tenantPage.goto("/keys");
    await tenantPage.fill('input[name="name"]', "e2e");
    await Promise.all([
      tenantPage.waitForURL((u) => u.pathname === "/keys"),
      tenantPage.click('form[action="/api/create_key"] button[type="submit"]'),
    ]);
    const key = (await tenantPage.textContent("#new-key-secret")).trim();
    assert.equal(await status(key), 200);

    // The admin suspends it from its page: the next call is refused with 403 within a second.
    await page.goto(`/admin/tenants/${handle}`);
    await page.click("details.confirm summary");
    await Promise.all([
      page.waitForURL((u) => u.pathname === `/admin/tenants/${handle}`),
      page.click('form[action="/api/admin_suspend_tenant"] button[type="submit"]'),
    ]);
    assert.match(await page.textContent("body"), /Tenant suspended/);
    const took = await until(key, 403, 2000);
    assert.ok(took < 1500, `refused after ${took} ms`);
    await page.screenshot({ path: join(shots, "admin-tenant.png"), fullPage: true });
    // Its user's session ended.
    await tenantPage.goto("/");
    assert.equal(new URL(tenantPage.url()).pathname, "/login");

    // Reactivated: the key works again.
    await Promise.all([
      page.waitForURL((u) => u.pathname === `/admin/tenants/${handle}`),
      page.click('form[action="/api/admin_reactivate_tenant"] button[type="submit"]'),
    ]);
    await until(key, 200, 2000);

    // The other admin pages, and the actions in the audit log.
    await page.goto(`/admin/audit?tenant=${handle}`);
    const audit = await page.textContent("table.audit");
    for (const action of ["tenant.create", "tenant.suspend", "tenant.reactivate"]) {
      assert.ok(audit.includes(action), `${action} in the audit log`);
    }
    assert.ok(audit.includes(adminEmail));
    await page.screenshot({ path: join(shots, "admin-audit.png"), fullPage: true });
    await page.goto("/admin/users");
    assert.ok((await page.textContent("body")).includes(email));
    await page.screenshot({ path: join(shots, "admin-users.png"), fullPage: true });
    await page.goto("/admin/ops");
    assert.ok((await page.locator("tr[data-replica]").count()) >= 1, "this replica reported");
    await page.screenshot({ path: join(shots, "admin-ops.png"), fullPage: true });
    await page.goto("/admin/fleet");
    const fleet = await page.textContent("main");
    assert.match(fleet, /llama-3\.1-8b-sim/);
    assert.match(fleet, /support-bot/);
    await page.screenshot({ path: join(shots, "admin-fleet.png"), fullPage: true });
  } finally {
    await admin.close();
    await member.close();
  }
});

test("the economics and fleet pages work with JavaScript off", async () => {
  const admin = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await signIn(admin, adminEmail, adminPassword, "/admin");

    // Economics: today's table per base, the what-if form and the cost form, server-rendered.
    const res = await page.goto("/admin/economics");
    assert.equal(res.status(), 200);
    const economics = await page.textContent("main");
    assert.match(economics, /Economics/);
    // The demo costs its simulated bases (two chat bases and the embedding base), so every base
    // has figures, not an empty table.
    assert.doesNotMatch(economics, /No cost in effect/);
    assert.equal(await page.locator("section.base-economics p.cost", { hasText: "per GPU-hour" }).count(), 3);
    assert.ok((await page.locator('form[action="/api/admin_set_base_cost"]').count()) === 1, "cost form");
    assert.ok((await page.locator('form[action="/admin/economics"]').count()) >= 1, "what-if form");
    await page.screenshot({ path: join(shots, "admin-economics.png"), fullPage: true });

    // The advisor (issue 36) for the demo's chat base: the candidate policies with an Apply
    // form each, the recommendation, and the cost versus cold-start frontier drawn on the server.
    // The budget is a GET form that works without script.
    const advisor = page.locator('section.advisor[data-base="llama-3.1-8b-sim"]');
    assert.equal(await advisor.count(), 1, "an advisor section for the demo base");
    assert.match(await advisor.locator("p.recommendation").textContent(), /^Recommended: floor \d+ · /);
    assert.ok((await advisor.locator("table.advisor-policies tbody tr").count()) >= 5, "candidate policies");
    assert.ok((await advisor.locator('form[action="/api/admin_apply_policy"]').count()) >= 4, "Apply forms");
    const frontier = advisor.locator("figure.frontier svg");
    assert.equal(await frontier.count(), 1);
    assert.ok(await frontier.isVisible());
    assert.match(await frontier.textContent(), /cold starts over the 30 days \(count\)/);
    assert.match(await frontier.textContent(), /\(recommended/);
    assert.equal(await advisor.locator("circle.mark.recommended").count(), 1);
    const budget = advisor.locator("form.budget");
    await budget.locator('input[value="starts"]').check();
    await budget.locator('input[name="max_starts"]').fill("2");
    await budget.locator('input[name="days"]').fill("7");
    await Promise.all([page.waitForURL((u) => u.searchParams.get("budget") === "starts"), budget.locator('button[type="submit"]').click()]);
    const advised = page.locator('section.advisor[data-base="llama-3.1-8b-sim"]');
    assert.match(await advised.textContent(), /at most 2 cold starts a day on average/);
    assert.match(await advised.locator("figure.frontier svg").textContent(), /over the 7 days/);
    // The weights and the attribution's rules are written on the page.
    assert.match(await page.textContent("p.weights"), /cached prompt token 0\.1/);
    await advised.screenshot({ path: join(shots, "admin-economics-advisor.png") });

    // Fleet: the cold-start figures, and a sleep-policy form per base that works without script.
    await page.goto("/admin/fleet");
    const fleet = await page.textContent("main");
    assert.match(fleet, /Cold starts/);
    assert.match(fleet, /Cold time to first token/);
    assert.match(fleet, /Sleep policy/);
    const form = page.locator('form.idle-form[action="/api/admin_set_idle_policy"]').first();
    if ((await form.count()) === 1) {
      const base = await form.locator('input[name="base"]').getAttribute("value");
      await form.locator('input[value="idle-after"]').check();
      await form.locator('input[name="after"]').fill("1h");
      await Promise.all([page.waitForURL((u) => u.pathname === "/admin/fleet"), form.locator('button[type="submit"]').click()]);
      assert.match(await page.textContent("main"), /Sleep policy saved/);
      assert.match(await page.textContent("table.sleep-policy"), /idle after 1h/);
      await page.screenshot({ path: join(shots, "admin-fleet.png"), fullPage: true });
      // Back to always on, so the demo stays warm.
      const again = page.locator(`form.idle-form:has(input[name="base"][value="${base}"])`);
      await again.locator('input[value="always-on"]').check();
      await Promise.all([page.waitForURL((u) => u.pathname === "/admin/fleet"), again.locator('button[type="submit"]').click()]);
      assert.match(await page.textContent("main"), /Sleep policy saved/);

      // The same base's adapters: each unloaded after 30 minutes idle, then always loaded again.
      const adapters = page.locator(`form.adapter-idle-form:has(input[name="base"][value="${base}"])`);
      await adapters.locator('input[value="idle-after"]').check();
      await adapters.locator('input[name="after"]').fill("30m");
      await Promise.all([page.waitForURL((u) => u.pathname === "/admin/fleet"), adapters.locator('button[type="submit"]').click()]);
      const row = `table.sleep-policy tr:has(input[name="base"][value="${base}"])`;
      assert.equal((await page.textContent(`${row} td.adapter-idle-policy`)).trim(), "unloaded after 30m idle");
      assert.equal((await page.textContent(`${row} td.idle-policy`)).trim(), "always on", "the graph's policy unchanged");
      await page.screenshot({ path: join(shots, "admin-fleet-adapters.png"), fullPage: true });
      const back = page.locator(`form.adapter-idle-form:has(input[name="base"][value="${base}"])`);
      await back.locator('input[value="always-loaded"]').check();
      await Promise.all([page.waitForURL((u) => u.pathname === "/admin/fleet"), back.locator('button[type="submit"]').click()]);
      assert.equal((await page.textContent(`${row} td.adapter-idle-policy`)).trim(), "always loaded");
    } else {
      await page.screenshot({ path: join(shots, "admin-fleet.png"), fullPage: true });
    }
  } finally {
    await admin.close();
  }
});

test("a tenant user gets the 403 page on admin pages", { skip: !process.env.TF_EMAIL }, async () => {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await signIn(context, process.env.TF_EMAIL, process.env.TF_PASSWORD, "/");
    assert.ok(!(await page.textContent("header.topbar")).includes("Tenants"), "no admin links");
    const res = await page.goto("/admin/tenants");
    assert.equal(res.status(), 403);
    assert.match(await page.textContent("main"), /Forbidden/);
    assert.equal(await page.getAttribute("main a", "href"), "/");
    await page.screenshot({ path: join(shots, "forbidden.png"), fullPage: true });
  } finally {
    await context.close();
  }
});
