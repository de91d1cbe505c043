"""The official `openai` Python package against the gateway, as a user would run it.

Streams a chat completion with and without usage, a non-streamed one, and lists models; exits
non-zero on any mismatch. Reads TF_BASE_URL (e.g. http://127.0.0.1:3000) and TF_API_KEY."""
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["TF_BASE_URL"] + "/v1", api_key=os.environ["TF_API_KEY"])
models = [m.id for m in client.models.list()]
assert "llama-3.1-8b-sim" in models and "support-bot" in models, models

text, usage_chunks = "", 0
for chunk in client.chat.completions.create(
    model="support-bot", stream=True, max_tokens=8,
    messages=[{"role": "user", "content": "Hello from the openai SDK"}],
    stream_options={"include_usage": True},
):
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage_chunks += 1
        assert chunk.usage.completion_tokens == 8, chunk.usage
assert usage_chunks == 1, usage_chunks
assert len(text.split()) == 8, text

for chunk in client.chat.completions.create(
    model="llama-3.1-8b-sim", stream=True, max_tokens=4,
    messages=[{"role": "user", "content": "no usage please"}],
):
    assert chunk.usage is None, chunk

r = client.completions.create(model="qwen-2.5-7b-sim", prompt="one two three", max_tokens=3)
assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == 3, r.usage

try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    sys.exit("unknown model accepted")
except Exception as e:  # openai.NotFoundError
    assert getattr(e, "status_code", None) == 404, e
print("openai SDK: streaming, usage, completions and errors OK")
