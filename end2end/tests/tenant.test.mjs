// The tenant console's people and settings pages in headless Chromium with JavaScript off: the
// owner sees /members, makes an invitation link (shown once) and withdraws it; /settings saves
// the tenant's body-logging choice (and turns it back off); /limits shows the tenant's limits;
// /models takes a generated adapter through its upload form, starts it (ready on the embedded
// simulator fleet, with its call snippets), stops it and deletes it.
// opted in, an API call's prompt and completion show on /logs/{request_id}, then "delete all".
// Screenshots of the pages go to TF_SCREENSHOT_DIR (default end2end/screenshots).
//
// Needs a running portal and a tenant owner: TF_BASE_URL, TF_EMAIL, TF_PASSWORD (as login.test.mjs).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
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

/// Writes a valid PEFT LoRA for the simulator's bases (hidden 64, 4 heads of 16, 2 KV heads, 2
/// layers) at rank 8 on q_proj and v_proj with zeroed BF16 weights, the shapes
/// server/src/lifecycle/fixture.rs makes; returns the folder holding both files.
function writeAdapter(baseModel) {
  const rank = 8;
  const hidden = 64;
  const outputs = { q_proj: 64, v_proj: 2 * 16 };
  const header = {};
  let offset = 0;
  for (let layer = 0; layer < 2; layer++) {
    for (const module of ["q_proj", "v_proj"]) {
      for (const [matrix, shape] of [["A", [rank, hidden]], ["B", [outputs[module], rank]]]) {
        const len = shape[0] * shape[1] * 2;
        const name = `base_model.model.model.layers.${layer}.self_attn.${module}.lora_${matrix}.weight`;
        header[name] = { dtype: "BF16", shape, data_offsets: [offset, offset + len] };
        offset += len;
      }
    }
  }
  const json = Buffer.from(JSON.stringify(header));
  const size = Buffer.alloc(8);
  size.writeBigUInt64LE(BigInt(json.length));
  const dir = mkdtempSync(join(tmpdir(), "tf-adapter-"));
  writeFileSync(join(dir, "adapter_model.safetensors"), Buffer.concat([size, json, Buffer.alloc(offset)]));
  writeFileSync(join(dir, "adapter_config.json"), JSON.stringify({
    peft_type: "LORA", base_model_name_or_path: baseModel, r: rank, lora_alpha: 2 * rank,
    target_modules: ["q_proj", "v_proj"], bias: "none", task_type: "CAUSAL_LM",
  }));
  return dir;
}

/// Reloads /models (as its meta refresh would) until `name`'s row shows `state`.
async function waitForState(page, name, state) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    await page.goto("/models");
    const row = page.locator("tr", { hasText: name });
    const text = (await row.count()) ? await row.first().textContent() : "";
    if (state === null ? text === "" : text.includes(state)) return;
    assert.ok(Date.now() < deadline, `${name} never became ${state}: ${text}`);
    await page.waitForTimeout(250);
  }
}

test("models: upload through the form, start, stop and delete (JavaScript off)", async () => {
  const { context, page } = await signedIn();
  await page.goto("/models");
  const main = await page.textContent("main");
  assert.match(main, /llama-3\.1-8b-sim/);
  assert.match(main, /support-bot/);
  assert.match(main, /sql-helper/);

  const name = `e2e-${Date.now()}`;
  const dir = writeAdapter("tokenfactory/llama-3.1-8b-sim");
  await page.fill("#model-name", name);
  await page.selectOption("#model-base", "llama-3.1-8b-sim");
  await page.setInputFiles("#model-config", join(dir, "adapter_config.json"));
  await page.setInputFiles("#model-weights", join(dir, "adapter_model.safetensors"));
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/models"),
    page.click('form[action="/models/upload"] button[type="submit"]'),
  ]);
  rmSync(dir, { recursive: true, force: true });
  assert.match(await page.textContent(".flash"), /uploaded and validated/);
  assert.match(await page.locator("tr", { hasText: name }).textContent(), /stopped/);

  await Promise.all([
    page.waitForURL((u) => u.pathname === "/models"),
    page.click(`form[action="/models/${name}/start"] button[type="submit"]`),
  ]);
  await waitForState(page, name, "ready");
  const snippets = await page.textContent("#snippets");
  assert.match(snippets, new RegExp(`"model": "${name}"`));
  assert.match(snippets, /\$TOKENFACTORY_API_KEY/);
  assert.match(snippets, /from openai import OpenAI/);
  await page.screenshot({ path: join(shots, "models.png"), fullPage: true });

  await Promise.all([
    page.waitForURL((u) => u.pathname === "/models"),
    page.click(`form[action="/models/${name}/stop"] button[type="submit"]`),
  ]);
  await waitForState(page, name, "stopped");

  // Delete: the disclosure opens without JavaScript; the confirmation must be ticked.
  const del = `form[action="/models/${name}/delete"]`;
  await page.click(`tr:has(${del}) details.confirm summary`);
  await page.check(`${del} input[name="confirm"]`);
  await Promise.all([
    page.waitForURL((u) => u.pathname === "/models"),
    page.click(`${del} button[type="submit"]`),
  ]);
  assert.match(await page.textContent(".flash"), /Deleted/);
  await waitForState(page, name, null);
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
  // Deleting asks first: the button is inside a closed confirmation (no JavaScript needed).
  await page.goto("/settings");
  assert.equal(await page.isVisible('form[action="/api/delete_stored_bodies"] button[type="submit"]'), false,
    "the delete button is behind a confirmation");
  await page.click("#delete-bodies summary");
  assert.match(await page.textContent("#delete-bodies"), /cannot be undone/);
  await page.screenshot({ path: join(shots, "settings-delete-confirm.png"), fullPage: true });
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
