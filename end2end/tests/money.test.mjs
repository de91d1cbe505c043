// Money typed as money, in headless Chromium with JavaScript off (issue 31): an admin types "$5"
// into a new tenant's spend-limit form and the limit is five dollars (shown back as $5.00 on the
// admin's page and on the tenant's /limits page), not five micro-units; a value with more than six
// decimals is refused and changes nothing. The invoice issuer form on /admin/invoices works the
// same way. Screenshots money-*.png in TF_SCREENSHOT_DIR.
//
// Needs a running portal and an admin: TF_BASE_URL, TF_ADMIN_EMAIL, TF_ADMIN_PASSWORD.

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

/// Submits `form` and waits for the redirect back to `path`.
async function submit(page, form, path) {
  await Promise.all([
    page.waitForURL((u) => u.pathname === path),
    form.locator('button[type="submit"]').click(),
  ]);
}

test("an admin types $5 into the spend-limit form and the limit is five dollars",
  { skip: !(adminEmail && adminPassword) }, async () => {
    const admin = await browser.newContext({ baseURL, javaScriptEnabled: false });
    const member = await browser.newContext({ baseURL, javaScriptEnabled: false });
    try {
      const page = await signIn(admin, adminEmail, adminPassword, "/admin");
      const handle = `e2e-money-${Date.now()}`;
      const email = `owner@${handle}.test`;
      await page.goto("/admin/tenants");
      await page.fill('input[name="name"]', handle);
      await page.fill('input[name="display_name"]', "Money Test");
      await page.fill('input[name="email"]', email);
      await submit(page, page.locator('form[action="/api/admin_create_tenant"]'), "/admin/tenants");
      const password = (await page.textContent("#new-password")).trim();

      const detail = `/admin/tenants/${handle}`;
      await page.goto(detail);
      const form = page.locator('form.limits[action="/api/admin_tenant_limits"]');
      await form.locator('input[name="spend_limit"]').fill("$5");
      await submit(page, form, detail);
      assert.match(await page.textContent("main"), /Limits saved/);
      assert.equal(await form.locator('input[name="spend_limit"]').inputValue(), "$5.00");
      await page.screenshot({ path: join(shots, "money-spend-limit.png"), fullPage: true });

      // More than six decimals is not a micro-unit amount: refused, the $5.00 kept.
      await form.locator('input[name="spend_limit"]').fill("5.0000001");
      await submit(page, form, detail);
      assert.match(await page.textContent("main"), /nothing was changed/);
      assert.equal(await form.locator('input[name="spend_limit"]').inputValue(), "$5.00");

      // The tenant sees five dollars as its limit.
      const tenantPage = await signIn(member, email, password, "/");
      await tenantPage.goto("/limits");
      assert.match(await tenantPage.textContent("main"), /\$0(\.00)? \/ \$5\.00/);
      await tenantPage.screenshot({ path: join(shots, "money-limits.png"), fullPage: true });
    } finally {
      await admin.close();
      await member.close();
    }
  });

test("the invoice issuer is set on /admin/invoices and the tenant's draft shows it",
  { skip: !(adminEmail && adminPassword) }, async () => {
    const admin = await browser.newContext({ baseURL, javaScriptEnabled: false });
    try {
      const page = await signIn(admin, adminEmail, adminPassword, "/admin");
      await page.goto("/admin/invoices");
      const form = page.locator('form[action="/api/admin_set_issuer"]');
      await form.locator('input[name="name"]').fill("Token Factory Demo Ltd");
      await form.locator('textarea[name="address"]').fill("1 Example Street\nLondon");
      await form.locator('input[name="due_days"]').fill("14");
      await submit(page, form, "/admin/invoices");
      assert.match(await page.textContent("main"), /Issuer saved/);
      assert.equal(await form.locator('input[name="due_days"]').inputValue(), "14");
      await page.screenshot({ path: join(shots, "money-issuer.png"), fullPage: true });
    } finally {
      await admin.close();
    }
  });
