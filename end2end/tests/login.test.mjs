// Logs in and out through the portal's forms in headless Chromium with JavaScript disabled, so the
// plain-HTML form -> server function -> redirect flow is what is exercised.
//
// Needs a running portal and an existing tenant member:
//   TF_BASE_URL (default http://127.0.0.1:8080), TF_EMAIL, TF_PASSWORD,
//   CHROMIUM (default /usr/bin/chromium).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const email = process.env.TF_EMAIL;
const password = process.env.TF_PASSWORD;

let browser;

before(async () => {
  assert.ok(email && password, "set TF_EMAIL and TF_PASSWORD to a tenant member's credentials");
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await browser?.close();
});

test("log in and out with JavaScript off", async () => {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: false });
  try {
    const page = await context.newPage();

    // Visiting home without a session lands on the login form.
    await page.goto("/");
    assert.equal(new URL(page.url()).pathname, "/login");
    assert.equal(await page.locator('form[action="/api/login"] input[name="csrf"]').count(), 1);

    // Wrong password: back on the form with the generic message.
    await page.fill('input[name="email"]', email);
    await page.fill('input[name="password"]', `${password}-wrong`);
    await Promise.all([page.waitForURL("**/login"), page.click('button[type="submit"]')]);
    assert.match(await page.textContent("body"), /Invalid email or password\./);

    // Right password: the tenant home shows who is signed in.
    await page.fill('input[name="email"]', email);
    await page.fill('input[name="password"]', password);
    await Promise.all([
      page.waitForURL((url) => url.pathname === "/"),
      page.click('button[type="submit"]'),
    ]);
    assert.match(await page.textContent(".topbar"), new RegExp(escapeRegExp(email.toLowerCase())));

    // The session cookie is not readable by scripts.
    const cookie = (await context.cookies()).find((c) => c.name === "tf_session");
    assert.ok(cookie, "a tf_session cookie");
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Lax");

    // Log out: back on the login page, and home is closed again.
    await Promise.all([
      page.waitForURL("**/login"),
      page.click('form[action="/api/logout"] button[type="submit"]'),
    ]);
    assert.equal(new URL(page.url()).pathname, "/login");
    await page.goto("/");
    assert.equal(new URL(page.url()).pathname, "/login");
  } finally {
    await context.close();
  }
});

function escapeRegExp(s) {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
