"""Issue 32: the official `openai` and `anthropic` Python packages, unchanged, against the gateway's
Responses, Embeddings and Messages endpoints, as a user would run them.

Each call is checked on what the SDK parses (text, vector shapes, usage) and then against the
usage event the gateway stored for its request id (`tokenfactory admin usage`): the event names
the endpoint and holds the tokens the SDK was told. Errors must come out as the SDKs' own
exception types: an unknown model (NotFoundError, 404), a wrong key (AuthenticationError, 401) and
a key over its limit (RateLimitError, 429). Exits non-zero on any mismatch.

Env: TF_BASE_URL (http://127.0.0.1:3000), TF_API_KEY (the demo key), TF_LIMITED_KEY (a key of
another tenant whose limits refuse every request: `admin limits --key K --rpm 0`), TF_BIN (the
`tokenfactory` binary) and DATABASE_URL (for `admin usage`). What differs between upstreams:
TF_USAGE_TENANT (whose events `admin usage` reads; default `demo`), TF_CHAT_MODEL (default the
demo's `llama-3.1-8b-sim`), TF_EMBED_MODEL (default `bge-small-sim`; empty: the upstream serves no
embeddings, and the embeddings calls are skipped with TF_EMBED_SKIP_REASON printed),
TF_SIMULATOR (`1`, the default: the engine simulator's own figures are checked too, such as the
reasoning tokens it reports; `0` for any other engine, whose counts are only compared with the
stored events) and TF_LABEL (named in the summary line).

Against the real Dynamo 1.6 frontend with its mocker engine (`end2end/run.sh` with
TF_DYNAMO_URL set), tried by hand with `--enable-anthropic-api`: it serves /v1/chat/completions,
/v1/responses (whole and streamed; `reasoning` is accepted and reasoning_tokens is 0) and
/v1/messages (whole and streamed; `message_start` carries an estimate of the prompt and
`message_delta` the engine's count, which the anthropic SDK keeps and the gateway bills). It does
not serve /v1/embeddings: the mocker is a generator and registers no embedding model, so the
frontend answers 404 `Model not found`; those calls are skipped there."""
import base64
import json
import os
import subprocess
import sys
import time

import anthropic
import openai

BASE = os.environ["TF_BASE_URL"]
KEY = os.environ["TF_API_KEY"]
LIMITED = os.environ["TF_LIMITED_KEY"]
CHAT_MODEL = os.environ.get("TF_CHAT_MODEL", "llama-3.1-8b-sim")
EMBED_MODEL = os.environ.get("TF_EMBED_MODEL", "bge-small-sim")
SIMULATOR = os.environ.get("TF_SIMULATOR", "1") == "1"
TENANT = os.environ.get("TF_USAGE_TENANT", "demo")
LABEL = os.environ.get("TF_LABEL", "simulator" if SIMULATOR else "upstream")
if not EMBED_MODEL:
    print("embeddings: skipped: " + os.environ.get("TF_EMBED_SKIP_REASON", "TF_EMBED_MODEL is empty"))

oa = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY)
# The anthropic package appends /v1/messages to its base URL and sends the key in `x-api-key`.
an = anthropic.Anthropic(base_url=BASE, api_key=KEY)

# request id -> (endpoint, prompt tokens, cached, completion tokens, reasoning tokens) as the SDK saw them
seen = {}


def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")


# --- Responses, not streamed (with reasoning asked: the simulator counts half the output as reasoning,
# Dynamo's mocker none; either way the stored event must hold what the SDK was told).
raw = oa.responses.with_raw_response.create(
    model=CHAT_MODEL, input="Hello from the Responses API", max_output_tokens=6,
    reasoning={"effort": "low"},
)
r = raw.parse()
check(isinstance(r, openai.types.responses.Response), f"responses type {type(r)}")
check(len(r.output_text.split()) >= 1, f"responses text {r.output_text!r}")
check(r.model == CHAT_MODEL, f"responses model {r.model}")
u = r.usage
check(u.output_tokens == 6 and u.input_tokens > 0, f"responses usage {u}")
check(u.total_tokens == u.input_tokens + u.output_tokens, f"responses total {u}")
if SIMULATOR:
    check(u.output_tokens_details.reasoning_tokens == 3, f"responses reasoning {u}")
seen[raw.headers["x-request-id"]] = (
    "responses", u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens,
    u.output_tokens_details.reasoning_tokens,
)

# --- Responses, streamed: typed events parsed by the SDK, the final response's usage.
stream = oa.responses.create(
    model=CHAT_MODEL, input="Stream the Responses API", max_output_tokens=5, stream=True,
)
deltas, final, types = "", None, []
for ev in stream:
    types.append(ev.type)
    if ev.type == "response.output_text.delta":
        deltas += ev.delta
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
# Stopped by `max_output_tokens`: the final event is `response.incomplete`, as OpenAI sends it.
check(types[0] == "response.created" and types[-1] == "response.incomplete", f"responses events {types}")
check(final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens", f"responses status {final}")
check(final is not None and final.usage.output_tokens == 5, f"responses stream usage {final}")
check(final.output_text == deltas and deltas.strip(), f"responses stream text {deltas!r} vs {final.output_text!r}")
fu = final.usage
seen[stream.response.headers["x-request-id"]] = (
    "responses", fu.input_tokens, fu.input_tokens_details.cached_tokens, fu.output_tokens,
    fu.output_tokens_details.reasoning_tokens,
)

# --- Responses through the SDK's stream helper (it accumulates the output items itself).
with oa.responses.stream(model=CHAT_MODEL, input="helper stream", max_output_tokens=4) as s:
    helper = list(s)
text = "".join(e.delta for e in helper if e.type == "response.output_text.delta")
done = [e for e in helper if e.type == "response.output_text.done"]
check(len(done) == 1 and done[0].text == text and text.strip(), f"responses helper text {text!r} {done}")
last = helper[-1]
check(last.type == "response.incomplete" and last.response.output_text == text, f"responses helper end {last}")
check(last.response.usage.output_tokens == 4, f"responses helper usage {last.response.usage}")

# --- Embeddings (only where the upstream serves an embedding model).
if EMBED_MODEL:
    # The SDK asks for base64 by default and decodes it into floats.
    raw = oa.embeddings.with_raw_response.create(model=EMBED_MODEL, input=["first text", "the second text"])
    e = raw.parse()
    check(len(e.data) == 2 and [d.index for d in e.data] == [0, 1], f"embeddings data {e.data}")
    dims = {len(d.embedding) for d in e.data}
    check(len(dims) == 1 and dims.pop() > 0, f"embeddings dims {[len(d.embedding) for d in e.data]}")
    check(all(isinstance(x, float) for x in e.data[0].embedding), "embedding floats")
    check(e.usage.prompt_tokens > 0 and e.usage.total_tokens == e.usage.prompt_tokens, f"embeddings usage {e.usage}")
    seen[raw.headers["x-request-id"]] = ("embeddings", e.usage.prompt_tokens, 0, 0, 0)
    # `dimensions` and float encoding, as asked.
    e2 = oa.embeddings.create(model=EMBED_MODEL, input="one", dimensions=16, encoding_format="float")
    check(len(e2.data) == 1 and len(e2.data[0].embedding) == 16, f"embeddings dimensions {len(e2.data[0].embedding)}")
    # base64 as sent on the wire decodes to the same vector length.
    raw_b64 = oa.embeddings.with_raw_response.create(model=EMBED_MODEL, input="one", dimensions=16, encoding_format="base64")
    wire = json.loads(raw_b64.http_response.text)
    check(len(base64.b64decode(wire["data"][0]["embedding"])) == 16 * 4, "base64 embedding of 16 float32")

# --- Anthropic Messages, not streamed.
raw = an.messages.with_raw_response.create(
    model=CHAT_MODEL, max_tokens=7, messages=[{"role": "user", "content": "Hello from the anthropic SDK"}],
)
m = raw.parse()
check(isinstance(m, anthropic.types.Message), f"messages type {type(m)}")
check(m.role == "assistant" and m.content and m.content[0].type == "text" and m.content[0].text.strip(), f"messages content {m.content}")
check(m.stop_reason == "max_tokens" and m.model == CHAT_MODEL, f"messages stop/model {m.stop_reason} {m.model}")
check(m.usage.output_tokens == 7 and m.usage.input_tokens > 0, f"messages usage {m.usage}")
cached = m.usage.cache_read_input_tokens or 0
seen[raw.headers["x-request-id"]] = (
    "messages", m.usage.input_tokens + cached + (m.usage.cache_creation_input_tokens or 0), cached, 7, 0,
)

# --- Anthropic Messages, streamed through the SDK's helper: text, final message, usage.
with an.messages.stream(
    model=CHAT_MODEL, max_tokens=5, system="Be brief.",
    messages=[{"role": "user", "content": "Stream from the anthropic SDK"}],
) as s:
    streamed = "".join(s.text_stream)
    fm = s.get_final_message()
    sid = s.response.headers["x-request-id"]
check(streamed.strip() and fm.content[0].text == streamed, f"messages stream text {streamed!r} vs {fm.content}")
check(fm.usage.output_tokens == 5 and fm.usage.input_tokens > 0 and fm.stop_reason == "max_tokens", f"messages stream usage {fm.usage}")
cached = fm.usage.cache_read_input_tokens or 0
seen[sid] = ("messages", fm.usage.input_tokens + cached + (fm.usage.cache_creation_input_tokens or 0), cached, 5, 0)

# --- Raw `stream=True` events, as the SDK types them.
kinds = [ev.type for ev in an.messages.create(
    model=CHAT_MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "events"}])]
check(kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds, f"messages events {kinds}")


# --- Chat Completions, whole and streamed (with usage asked), beside the new endpoints.
raw = oa.chat.completions.with_raw_response.create(
    model=CHAT_MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hello from chat completions"}],
)
c = raw.parse()
check(c.choices[0].message.content.strip() and c.choices[0].finish_reason == "length", f"chat answer {c.choices}")
check(c.usage.completion_tokens == 6 and c.usage.prompt_tokens > 0, f"chat usage {c.usage}")
cd = c.usage.prompt_tokens_details
seen[raw.headers["x-request-id"]] = (
    "chat", c.usage.prompt_tokens, (cd.cached_tokens or 0) if cd else 0, c.usage.completion_tokens,
    (c.usage.completion_tokens_details.reasoning_tokens or 0) if c.usage.completion_tokens_details else 0,
)
raw = oa.chat.completions.with_raw_response.create(
    model=CHAT_MODEL, max_tokens=4, stream=True, stream_options={"include_usage": True},
    messages=[{"role": "user", "content": "Stream chat completions"}],
)
chunks = list(raw.parse())
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
usage = [ch.usage for ch in chunks if ch.usage is not None]
check(text.strip() and len(usage) == 1 and usage[0].completion_tokens == 4, f"chat stream {text!r} {usage}")
cu = usage[0]
seen[raw.headers["x-request-id"]] = (
    "chat", cu.prompt_tokens, (cu.prompt_tokens_details.cached_tokens or 0) if cu.prompt_tokens_details else 0,
    cu.completion_tokens, 0,
)


# --- Errors, parsed by each SDK into its exception types.
def expect(exc, status, call, what):
    try:
        call()
    except exc as err:
        check(err.status_code == status, f"{what}: status {err.status_code}")
        return err
    except Exception as err:  # noqa: BLE001 - any other type is the failure being tested
        sys.exit(f"FAILED: {what}: {type(err).__name__} {err}")
    sys.exit(f"FAILED: {what}: no error")


def calls(oa_client, an_client, model, embed_model):
    out = [
        ("chat", lambda: oa_client.chat.completions.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "x"}])),
        ("responses", lambda: oa_client.responses.create(model=model, input="x", max_output_tokens=2)),
        ("responses stream", lambda: list(oa_client.responses.create(model=model, input="x", max_output_tokens=2, stream=True))),
        ("messages", lambda: an_client.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "x"}])),
        ("messages stream", lambda: an_client.messages.stream(model=model, max_tokens=2, messages=[{"role": "user", "content": "x"}]).__enter__().get_final_message()),
    ]
    if embed_model:
        out.append(("embeddings", lambda: oa_client.embeddings.create(model=embed_model, input="x")))
    return out


for name, call in calls(oa, an, "no-such-model", "no-such-model" if EMBED_MODEL else ""):
    is_an = name.startswith("messages")
    err = expect(anthropic.NotFoundError if is_an else openai.NotFoundError, 404, call, f"unknown model on {name}")
    if is_an:
        check(err.body["type"] == "error" and err.body["error"]["type"] == "not_found_error", f"anthropic envelope {err.body}")
    else:
        check(err.code == "model_not_found", f"openai error code {err.code}")

bad_oa = openai.OpenAI(base_url=BASE + "/v1", api_key="tf-not-a-key", max_retries=0)
bad_an = anthropic.Anthropic(base_url=BASE, api_key="tf-not-a-key", max_retries=0)
for name, call in calls(bad_oa, bad_an, CHAT_MODEL, EMBED_MODEL):
    is_an = name.startswith("messages")
    err = expect(anthropic.AuthenticationError if is_an else openai.AuthenticationError, 401, call, f"bad key on {name}")
    if is_an:
        check(err.body["error"]["type"] == "authentication_error", f"anthropic envelope {err.body}")

# A key whose limits refuse everything (rpm 0). No SDK retries: a 429 is the answer.
lim_oa = openai.OpenAI(base_url=BASE + "/v1", api_key=LIMITED, max_retries=0)
lim_an = anthropic.Anthropic(base_url=BASE, api_key=LIMITED, max_retries=0)
for name, call in calls(lim_oa, lim_an, CHAT_MODEL, EMBED_MODEL):
    is_an = name.startswith("messages")
    err = expect(anthropic.RateLimitError if is_an else openai.RateLimitError, 429, call, f"over quota on {name}")
    check(err.response.headers.get("retry-after"), f"retry-after on {name}")
    if is_an:
        check(err.body["error"]["type"] == "rate_limit_error", f"anthropic envelope {err.body}")

# --- The stored events: one per request id, naming its endpoint, holding the tokens the SDK saw.
env = dict(os.environ)
deadline = time.time() + 20
while True:
    out = subprocess.run(
        [os.environ["TF_BIN"], "admin", "usage", "--tenant", TENANT],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    events = {}
    for line in out.splitlines():
        ev = json.loads(line)
        events.setdefault(ev["request_id"], []).append(ev)
    missing = [rid for rid in seen if rid not in events]
    if not missing or time.time() > deadline:
        break
    time.sleep(0.25)
check(not missing, f"no usage event for {missing}")
for rid, (endpoint, prompt, cached, completion, reasoning) in seen.items():
    evs = events[rid]
    check(len(evs) == 1, f"{rid}: {len(evs)} events")
    ev = evs[0]
    got = (ev["endpoint"], ev["prompt_tokens"], ev["cached_tokens"], ev["completion_tokens"], ev["reasoning_tokens"])
    check(got == (endpoint, prompt, cached, completion, reasoning), f"{rid}: stored {got}, the SDK saw {(endpoint, prompt, cached, completion, reasoning)}")
    check(ev["status"] == "ok", f"{rid}: status {ev['status']}")
    print(f"  {endpoint:<10} {rid}: prompt {prompt}, cached {cached}, completion {completion}, "
          f"reasoning {reasoning}: the SDK's == the stored event's")
served = "chat (whole, streamed), responses (whole, streamed, helper), " + ("embeddings, " if EMBED_MODEL else "") + \
    "messages (whole, streamed)"
print(f"openai + anthropic SDKs against the gateway in front of {LABEL}: {served}, "
      f"404/401/429 as SDK exceptions, {len(seen)} stored events matching OK")
