// Billing pages in headless Chromium with JavaScript off: the tenant's /invoices (the open
// month's live draft, the credit balance, the detail page and its CSV link) and the admin's
// /admin/prices (the book in effect, its versions and the form) and /admin/invoices. Screenshots
// `invoices.png`, `invoice.png`, `admin-prices.png` and `admin-invoices.png` go to TF_SCREENSHOTS
// (default end2end/screenshots).
//
// Needs a running portal: TF_BASE_URL, a tenant member (TF_EMAIL, TF_PASSWORD) and, for the admin
// pages, TF_ADMIN_EMAIL and TF_ADMIN_PASSWORD; CHROMIUM (default /usr/bin/chromium).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const email = process.env.TF_EMAIL;
const password = process.env.TF_PASSWORD;
const adminEmail = process.env.TF_ADMIN_EMAIL;
const adminPassword = process.env.TF_ADMIN_PASSWORD;
const shots = process.env.TF_SCREENSHOTS ?? new URL("../screenshots", import.meta.url).pathname;

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

async function signIn(user, pass, home) {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false,
    viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  await page.goto("/login");
  await page.fill('input[name="email"]', user);
  await page.fill('input[name="password"]', pass);
  await Promise.all([page.waitForURL((url) => url.pathname === home), page.click('button[type="submit"]')]);
  return { context, page };
}

test("the tenant's invoices with JavaScript off", { skip: !(email && password) }, async () => {
  const { context, page } = await signIn(email, password, "/");
  try {
    await page.click('nav.nav a[href="/invoices"]');
    assert.equal(new URL(page.url()).pathname, "/invoices");
    assert.ok(await page.locator("#credit-balance").isVisible(), "the credit balance");
    const live = page.locator('tr.invoice-row[data-id="current"]');
    assert.equal(await live.count(), 1, "the open month's live draft");
    await page.screenshot({ path: join(shots, "invoices.png"), fullPage: true });

    await live.locator("a").first().click();
    assert.equal(new URL(page.url()).pathname, "/invoices/current");
    assert.match(await page.locator("#invoice-total").innerText(), /^\$/);
    // The draft as a document: who it is from and to, numbered only when issued.
    assert.ok((await page.locator("#invoice-bill-to").innerText()).length > 0, "bill-to");
    assert.ok((await page.locator("#invoice-issuer").innerText()).length > 0, "issuer");
    assert.equal((await page.locator("#invoice-number").innerText()).trim(), "assigned when issued");
    assert.match(await page.locator("#invoice-due").innerText(), /days after issue/);
    await page.screenshot({ path: join(shots, "invoice.png"), fullPage: true });

    const csv = await context.request.get("/invoices/current.csv");
    assert.equal(csv.status(), 200);
    assert.match(csv.headers()["content-disposition"], /^attachment; filename="invoice-/);
    assert.match(await csv.text(), /^invoice,month,status,kind,description,/);
  } finally {
    await context.close();
  }
});

test("the price book and every tenant's invoices with JavaScript off",
  { skip: !(adminEmail && adminPassword) }, async () => {
    const { context, page } = await signIn(adminEmail, adminPassword, "/admin");
    try {
      await page.click('nav.nav a[href="/admin/prices"]');
      assert.equal(new URL(page.url()).pathname, "/admin/prices");
      assert.ok(await page.locator("details.version").count() >= 1, "versions listed");
      assert.ok(await page.locator('form.price-form input[name="csrf"]').count() === 1, "the form");
      await page.screenshot({ path: join(shots, "admin-prices.png"), fullPage: true });

      await page.click('nav.nav a[href="/admin/invoices"]');
      assert.equal(new URL(page.url()).pathname, "/admin/invoices");
      await page.screenshot({ path: join(shots, "admin-invoices.png"), fullPage: true });
    } finally {
      await context.close();
    }
  });
