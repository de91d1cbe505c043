// The portal on a 390 px phone, headless Chromium with JavaScript off (issue 37, item 10): on
// every tenant page (and every admin page, given an admin) the page is no wider than the screen:
// the navigation wraps onto its own lines and wide tables scroll inside their panel. The full-page
// screenshot's width is the page's width, so it is the measure. Screenshots phone-*.png in
// TF_SCREENSHOT_DIR.
//
// Needs a running portal and a tenant member: TF_BASE_URL, TF_EMAIL, TF_PASSWORD; optionally an
// admin: TF_ADMIN_EMAIL, TF_ADMIN_PASSWORD.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const shots = process.env.TF_SCREENSHOT_DIR ?? new URL("../screenshots", import.meta.url).pathname;
const WIDTH = 390;

let browser;

before(async () => {
  assert.ok(process.env.TF_EMAIL && process.env.TF_PASSWORD, "set TF_EMAIL and TF_PASSWORD");
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

/// The width of a PNG (bytes 16..20 of its IHDR chunk).
function pngWidth(png) {
  return png.readUInt32BE(16);
}

async function onPhone(email, password, home, pages, prefix) {
  const context = await browser.newContext({
    baseURL,
    javaScriptEnabled: false,
    viewport: { width: WIDTH, height: 844 },
    deviceScaleFactor: 1,
  });
  try {
    const page = await context.newPage();
    await page.goto("/login");
    assert.ok(pngWidth(await page.screenshot({ fullPage: true })) <= WIDTH, "/login is too wide");
    await page.fill('input[name="email"]', email);
    await page.fill('input[name="password"]', password);
    await Promise.all([page.waitForURL((u) => u.pathname === home), page.click('button[type="submit"]')]);
    const tooWide = [];
    for (const path of pages) {
      const res = await page.goto(path);
      assert.ok(res.status() < 400, `${path}: ${res.status()}`);
      const name = `phone-${prefix}${path.replace(/^\/$/, "home").replace(/\//g, "-").replace(/^-/, "")}.png`;
      const png = await page.screenshot({ path: join(shots, name), fullPage: true });
      if (pngWidth(png) > WIDTH) tooWide.push(`${path} (${pngWidth(png)} px)`);
      // Every navigation link can be reached without scrolling sideways.
      for (const link of await page.locator("header.topbar nav a").all()) {
        const box = await link.boundingBox();
        assert.ok(box && box.x >= 0 && box.x + box.width <= WIDTH + 1, `${path}: a nav link is off screen`);
      }
    }
    assert.deepEqual(tooWide, [], "pages wider than the phone");
  } finally {
    await context.close();
  }
}

test("every tenant page fits a 390 px phone (JavaScript off)", async () => {
  await onPhone(process.env.TF_EMAIL, process.env.TF_PASSWORD, "/",
    ["/", "/keys", "/usage", "/logs", "/models", "/limits", "/invoices", "/members", "/settings",
      "/audit"], "");
});

test("every admin page fits a 390 px phone (JavaScript off)",
  { skip: !(process.env.TF_ADMIN_EMAIL && process.env.TF_ADMIN_PASSWORD) }, async () => {
  await onPhone(process.env.TF_ADMIN_EMAIL, process.env.TF_ADMIN_PASSWORD, "/admin",
    ["/admin", "/admin/tenants", "/admin/users", "/admin/audit", "/admin/fleet", "/admin/prices",
      "/admin/invoices", "/admin/economics", "/admin/ops"], "");
});
