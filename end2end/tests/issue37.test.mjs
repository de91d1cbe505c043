// Issue 37's portal fixes in headless Chromium with JavaScript off (and on, for the copy buttons):
// costs aligned in one column format (item 4); key rotations named apart, copy buttons as a
// progressive enhancement, the request log's "Newer" link (item 8); the admin invoices' "as of"
// (item 11); a stored request read as a conversation (item 1); the tenant's own audit log and the
// readable admin audit (item 7); the endpoint column and filter of the log and the usage page's
// per-model and per-key views (item 5). Screenshots issue37-*.png in TF_SCREENSHOT_DIR.
//
// Needs a running portal: TF_BASE_URL, TF_EMAIL, TF_PASSWORD (a tenant owner), TF_API_KEY (a key
// of that tenant); optionally TF_ADMIN_EMAIL, TF_ADMIN_PASSWORD.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const baseURL = (process.env.TF_BASE_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const email = process.env.TF_EMAIL;
const password = process.env.TF_PASSWORD;
const apiKey = process.env.TF_API_KEY;
const adminEmail = process.env.TF_ADMIN_EMAIL;
const adminPassword = process.env.TF_ADMIN_PASSWORD;
const shots = process.env.TF_SCREENSHOT_DIR ?? new URL("../screenshots", import.meta.url).pathname;

let browser;

before(async () => {
  assert.ok(email && password, "set TF_EMAIL and TF_PASSWORD");
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

async function signIn(user, pass, home, js = false) {
  const context = await browser.newContext({ baseURL, javaScriptEnabled: js,
    viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  await page.goto("/login");
  await page.fill('input[name="email"]', user);
  await page.fill('input[name="password"]', pass);
  await Promise.all([page.waitForURL((u) => u.pathname === home), page.click('button[type="submit"]')]);
  return { context, page };
}

async function chat(content, extra = {}) {
  const res = await fetch(`${baseURL}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "llama-3.1-8b-sim", max_tokens: 6,
      messages: [{ role: "user", content }], ...extra }),
  });
  assert.equal(res.status, 200);
  await res.text();
  return res.headers.get("x-request-id");
}

/// The digits after the point of each "$..." text.
const decimals = (texts) => texts.map((t) => (t.trim().split(".")[1] ?? "").length);

test("item 4: each cost column has one number of decimals, right-aligned", async () => {
  if (apiKey) await chat("a priced request");
  const { context, page } = await signIn(email, password, "/");
  try {
    for (const [path, cells] of [["/usage", "table.usage td.cost"], ["/logs", "table.log td.cost"]]) {
      // Usage is shipped from the journal within a moment.
      for (let i = 0; i < 40; i++) {
        await page.goto(path);
        if (await page.locator(cells).count() > 0) break;
        await page.waitForTimeout(250);
      }
      const texts = await page.locator(cells).allInnerTexts();
      assert.ok(texts.length >= 1, `${path}: cost cells`);
      assert.equal(new Set(decimals(texts)).size, 1, `${path}: ${texts.join(" ")}`);
      const align = await page.locator(cells).first().evaluate((el) => getComputedStyle(el).textAlign);
      assert.equal(align, "right");
      await page.screenshot({ path: join(shots, `issue37-cost${path.replace("/", "-")}.png`), fullPage: true });
    }
    // The summary line's cost has the column's decimals.
    await page.goto("/usage");
    const summary = await page.locator("p.summary").innerText();
    const total = await page.locator("tr.totals td.cost").innerText();
    assert.ok(summary.includes(`cost ${total.trim()}.`), `${summary} / ${total}`);
  } finally {
    await context.close();
  }
});

test("item 8: rotations are named apart; copy buttons only with JavaScript", async () => {
  const { context, page } = await signIn(email, password, "/");
  try {
    const name = `e2e-rot-${Date.now()}`;
    await page.goto("/keys");
    await page.fill('input[name="name"]', name);
    await Promise.all([page.waitForURL((u) => u.pathname === "/keys"),
      page.click('form[action="/api/create_key"] button[type="submit"]')]);
    // JavaScript off: the secret is selectable text, the copy button stays hidden.
    assert.equal(await page.locator('button[data-copy="new-key-secret"]').isVisible(), false);
    assert.equal(await page.locator("#new-key-secret").evaluate((el) => getComputedStyle(el).userSelect), "all");
    const rotate = async (keyName) => {
      const row = page.locator("table.keys tr", { has: page.locator(`td:text-is("${keyName}")`) });
      await row.locator("details.confirm summary", { hasText: "Rotate" }).click();
      await Promise.all([page.waitForURL((u) => u.pathname === "/keys"),
        row.locator('form[action="/api/rotate_key"] button[type="submit"]').click()]);
    };
    await rotate(name);
    await rotate(name);
    const names = await page.locator("table.keys tbody tr td:first-child").allInnerTexts();
    const mine = names.filter((n) => n.startsWith(name));
    assert.deepEqual(mine.sort(), [name, `${name} (rotated 2)`, `${name} (rotated)`].sort());
    await page.screenshot({ path: join(shots, "issue37-keys-rotated.png"), fullPage: true });
  } finally {
    await context.close();
  }
  // JavaScript on: the copy buttons appear by the home's snippet.
  const on = await signIn(email, password, "/", true);
  try {
    assert.equal(await on.page.locator('button[data-copy="quick-start"]').isVisible(), true);
    await on.page.goto("/models");
    assert.ok(await on.page.locator('button[data-copy="curl-0"]').isVisible(), "a snippet's copy button");
  } finally {
    await on.context.close();
  }
});

test("item 8: the request log has a Newer link back from an older page", { skip: !apiKey }, async () => {
  // More than a page (50) of requests.
  for (let i = 0; i < 52; i++) await chat(`pager ${i}`);
  const { context, page } = await signIn(email, password, "/");
  try {
    let older;
    for (let i = 0; i < 40; i++) {
      await page.goto("/logs");
      older = await page.locator("nav.pager a.older").getAttribute("href").catch(() => null);
      if (older) break;
      await page.waitForTimeout(250);
    }
    assert.ok(older, "an Older link");
    const first = await page.locator("tr.log-row").first().getAttribute("data-request-id");
    assert.equal(await page.locator("nav.pager a.newer").count(), 0, "no Newer on the newest page");
    await page.goto(older);
    const newer = page.locator("nav.pager a.newer");
    assert.equal(await newer.count(), 1);
    await page.screenshot({ path: join(shots, "issue37-logs-older.png"), fullPage: true });
    await newer.click();
    assert.equal(await page.locator("tr.log-row").first().getAttribute("data-request-id"), first);
  } finally {
    await context.close();
  }
});

test("item 1: a stored request reads as a conversation", { skip: !apiKey }, async () => {
  const { context, page } = await signIn(email, password, "/");
  try {
    await page.goto("/settings");
    await page.check('input[name="body_logging"]');
    await Promise.all([page.waitForURL((u) => u.pathname === "/settings"),
      page.click('form[action="/api/save_tenant_settings"] button[type="submit"]')]);
    let found;
    for (let i = 0; i < 20 && !found; i++) {
      const id = await chat("tell me about tokens", { stream: true, stream_options: { include_usage: true } });
      for (let j = 0; j < 20; j++) {
        await page.goto(`/logs/${id}`);
        if (await page.$("#conversation")) { found = id; break; }
        if (await page.$("#no-bodies")) break;
        await page.waitForTimeout(100);
      }
    }
    assert.ok(found, "a stored streamed request");
    assert.match(await page.locator("#conversation .role-user").innerText(), /tell me about tokens/);
    assert.ok((await page.locator("#completion-text").innerText()).length > 0, "the answer's text");
    assert.match(await page.locator("#conversation .source").innerText(), /assembled from \d+ stream events/);
    assert.equal(await page.locator("#streamed").innerText(), "yes");
    assert.match(await page.locator("#provenance").innerText(), /engine|partly|estimated/);
    assert.notEqual(await page.locator("#finish-reason").innerText(), "");
    assert.equal(await page.locator("#completion-body").isVisible(), false, "raw behind a disclosure");
    await page.screenshot({ path: join(shots, "issue37-conversation.png"), fullPage: true });
    await page.click("#raw-bodies summary");
    assert.equal(await page.locator("#completion-body").isVisible(), true);
    await page.screenshot({ path: join(shots, "issue37-conversation-raw.png"), fullPage: true });
    await page.goto("/settings");
    await page.uncheck('input[name="body_logging"]');
    await Promise.all([page.waitForURL((u) => u.pathname === "/settings"),
      page.click('form[action="/api/save_tenant_settings"] button[type="submit"]')]);
  } finally {
    await context.close();
  }
});

test("item 7: the owner's audit log, readable", async () => {
  const { context, page } = await signIn(email, password, "/");
  try {
    await page.goto("/settings");
    await Promise.all([page.waitForURL((u) => u.pathname === "/audit"), page.click("#audit-link a")]);
    const rows = page.locator("table.audit tbody tr");
    assert.ok(await rows.count() >= 1, "the tenant's actions");
    assert.ok(await page.locator("table.audit dl.kv dt").count() >= 1, "key: value details");
    assert.equal(await page.locator("table.audit thead th", { hasText: "Tenant" }).count(), 0);
    await page.screenshot({ path: join(shots, "issue37-audit.png"), fullPage: true });
    await page.selectOption('select[name="action"]', "key");
    await Promise.all([page.waitForURL((u) => u.search.includes("action=key")),
      page.click('form.filters button[type="submit"]')]);
    for (const a of await page.locator("table.audit tbody tr").evaluateAll((trs) => trs.map((t) => t.dataset.action))) {
      assert.match(a, /^key\./);
    }
  } finally {
    await context.close();
  }
});

test("items 7 and 11: admin audit filter and detail; invoices as of their build",
  { skip: !(adminEmail && adminPassword) }, async () => {
    const { context, page } = await signIn(adminEmail, adminPassword, "/admin");
    try {
      await page.goto("/admin/audit");
      const options = await page.locator('select[name="action"] option').evaluateAll((os) => os.map((o) => o.value));
      for (const f of ["model", "member", "bodies", "prices", "invoice", "fleet"]) {
        assert.ok(options.includes(f), `the filter offers ${f}`);
      }
      assert.ok(await page.locator("table.audit dl.kv").count() >= 1, "readable details");
      await page.screenshot({ path: join(shots, "issue37-admin-audit.png"), fullPage: true });
      // Build the demo tenant's draft now: its figures are a snapshot, so they say when.
      await page.goto("/admin/invoices");
      await Promise.all([page.waitForURL((u) => u.pathname === "/admin/invoices"),
        page.click('button:has-text("Build draft")')]);
      const drafts = page.locator("tr.invoice-row.status-draft");
      assert.ok(await drafts.count() > 0, "a draft");
      assert.match(await drafts.first().locator("td.total .as-of").innerText(),
        /^as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);
      await drafts.first().locator("td a").first().click();
      assert.match(await page.locator("#as-of").innerText(), /^Figures as of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC/);
      await page.screenshot({ path: join(shots, "issue37-admin-invoice-detail.png"), fullPage: true });
      await page.goto("/admin/invoices");
      await page.screenshot({ path: join(shots, "issue37-admin-invoices.png"), fullPage: true });
    } finally {
      await context.close();
    }
  });

test("item 5: endpoints on the request log; usage by model and by key", async () => {
  const { context, page } = await signIn(email, password, "/");
  try {
    await page.goto("/logs");
    assert.ok(await page.locator("table.log td.endpoint").count() >= 1, "an endpoint column");
    await page.selectOption('select[name="endpoint"]', "chat");
    await Promise.all([page.waitForURL((u) => u.search.includes("endpoint=chat")),
      page.click('form.filters button[type="submit"]')]);
    for (const e of await page.locator("table.log td.endpoint").allInnerTexts()) assert.equal(e, "chat");
    await page.screenshot({ path: join(shots, "issue37-logs-endpoint.png"), fullPage: true });

    // The usage chart stacked by model, then by key, with its unit; tokens per endpoint.
    await page.goto("/usage");
    assert.ok(await page.locator("table.endpoints tr.endpoint-row").count() >= 1, "tokens per endpoint");
    for (const [view, legend] of [["model", /llama-3\.1-8b-sim/], ["key", /demo key/]]) {
      await page.selectOption('select[name="view"]', view);
      await Promise.all([page.waitForURL((u) => u.search.includes(`view=${view}`)),
        page.click('form.filters button[type="submit"]')]);
      assert.match(await page.locator(".chart .legend").innerText(), legend);
      assert.equal(await page.locator(".chart svg text.unit").first().textContent(), "tokens");
      // The chart is as wide as the table under it.
      const chart = await page.locator(".chart svg").boundingBox();
      const table = await page.locator("table.usage").first().boundingBox();
      assert.ok(Math.abs(chart.width - table.width) <= 2, `${chart.width} vs ${table.width}`);
      await page.screenshot({ path: join(shots, `issue37-usage-by-${view}.png`), fullPage: true });
    }
  } finally {
    await context.close();
  }
});
