#!/usr/bin/env bash
# End-to-end checks of the product as a user runs it: `tokenfactory serve` on its embedded
# default (on a scratch database and port), the official openai Python package streaming through
# it with the printed key, the openai and anthropic packages on Responses, Embeddings and
# Messages, and the portal login in Debian's Chromium with JavaScript off. With TF_DYNAMO_URL set
# (a running Dynamo frontend, as scripts/test.sh starts it from ../shared/dynamo-cpu), the same SDK
# checks also run against a second gateway whose chat base is that frontend's model.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
db="tokenfactory_e2e_$$"
port=$((20000 + RANDOM % 20000))
# Every failure names its line and command (as written, unexpanded: no key is printed) and the
# servers' last log lines (not the banner, which holds the demo's credentials), on stderr: CI shows
# only the end of the output, and a step that fails quietly (a wait that times out, a tool that
# writes its error to stdout) would otherwise leave nothing to read there.
failed() {
  echo "end2end: failed (exit $1) at line $2: $3" >&2
  for f in serve.err dyn-serve.err; do
    [ -s "$work/$f" ] && { echo "--- last lines of $f" >&2; tail -30 "$work/$f" >&2; }
  done
  return 0
}
trap 'failed $? $LINENO "$BASH_COMMAND"' ERR

if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
command -v npm >/dev/null 2>&1 || { SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null; }

echo "end2end: building" >&2
cargo build -q -p tokenfactory
echo "end2end: starting the demo gateway" >&2
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" TF_LISTEN="127.0.0.1:$port" \
  TF_METRICS_LISTEN="127.0.0.1:0" TF_JOURNAL_DIR="$work/journal" TF_REDIS_PREFIX="e2e:$$:" TF_DEMO_STATE="$work/demo.json" \
  target/debug/tokenfactory serve --demo --allow-owner-role > "$work/serve.log" 2> "$work/serve.err" &
server=$!
dyn_server=""
dyn_db="tokenfactory_e2e_dynamo_$$"
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  if [ -n "$dyn_server" ]; then
    kill "$dyn_server" 2>/dev/null || true
    wait "$dyn_server" 2>/dev/null || true
  fi
  psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $dyn_db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 240); do grep -q "API key:" "$work/serve.log" 2>/dev/null && break; sleep 0.5; done
grep -q "API key:" "$work/serve.log" || { echo "end2end: no API key printed within 120 s" >&2; false; }
key=$(sed -n 's/^ *API key: *//p' "$work/serve.log")
email=$(sed -n 's/^ *Tenant login: *\([^ ]*\) \/ .*/\1/p' "$work/serve.log")
password=$(sed -n 's/^ *Tenant login: *[^ ]* \/ *//p' "$work/serve.log")
admin_email=$(sed -n 's/^ *Admin login: *\([^ ]*\) \/ .*/\1/p' "$work/serve.log")
admin_password=$(sed -n 's/^ *Admin login: *[^ ]* \/ *//p' "$work/serve.log")

# The curl line the banner prints must work as printed.
curl_line=$(grep -E '^ *curl ' "$work/serve.log" | sed 's/^ *//')
out=$(bash -c "$curl_line -sS -f")
echo "$out" | grep -q '"completion_tokens"' || { echo "printed curl failed: $out" >&2; exit 1; }
echo "printed curl line: OK"

# The official openai Python package.
# Installed into a scratch directory (no venv: ensurepip is not reliable on every image).
python3 -m pip install -q --disable-pip-version-check --target "$work/py" openai anthropic
PYTHONPATH="$work/py" TF_BASE_URL="http://127.0.0.1:$port" TF_API_KEY="$key" python3 end2end/openai_sdk.py

# Responses, Embeddings and Anthropic Messages through the official openai and anthropic
# packages; the 429 case uses a key of its own tenant whose limits refuse every request.
admin() { DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" target/debug/tokenfactory admin "$@"; }
admin create-tenant --name sdk-quota > /dev/null
limited=$(admin issue-key --tenant sdk-quota | tail -n 1)
admin limits --key "$limited" --rpm 0 > /dev/null
PYTHONPATH="$work/py" TF_BASE_URL="http://127.0.0.1:$port" TF_API_KEY="$key" TF_LIMITED_KEY="$limited" \
  TF_BIN="$root/target/debug/tokenfactory" DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" \
  python3 end2end/sdk_endpoints.py

# The same SDK checks through a gateway in front of the real Dynamo frontend (its mocker engine):
# `serve --fleet static:FILE` on a database of its own, a tenant and keys from the admin CLI. The
# mocker serves no embedding model, so the script is told to skip embeddings (its docstring says
# what Dynamo 1.6 serves).
if [ -n "${TF_DYNAMO_URL:-}" ]; then
  dyn_model="${TF_DYNAMO_MODEL:-tiny-llama}"
  dyn_port=$((port + 1))
  printf '[[base]]\nname = "%s"\nupstream = "%s"\ngraph = "dynamo"\n' "$dyn_model" "$TF_DYNAMO_URL" \
    > "$work/dynamo-fleet.toml"
  dyn_url="postgres://postgres@127.0.0.1:5432/$dyn_db"
  DATABASE_URL="$dyn_url" TF_LISTEN="127.0.0.1:$dyn_port" TF_METRICS_LISTEN="127.0.0.1:0" \
    TF_JOURNAL_DIR="$work/dyn-journal" TF_REDIS_PREFIX="e2e-dyn:$$:" TF_DEMO=false \
    target/debug/tokenfactory serve --allow-owner-role --fleet "static:$work/dynamo-fleet.toml" \
    > "$work/dyn-serve.log" 2> "$work/dyn-serve.err" &
  dyn_server=$!
  # Ready once it answers /v1/models (401 without a key).
  for _ in $(seq 1 120); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$dyn_port/v1/models")" = 401 ] && break
    sleep 0.5
  done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$dyn_port/v1/models")" = 401 ] \
    || { echo "the gateway in front of Dynamo did not start" >&2; cat "$work/dyn-serve.err" >&2; exit 1; }
  dyn_admin() { DATABASE_URL="$dyn_url" target/debug/tokenfactory admin "$@"; }
  dyn_admin create-tenant --name sdk-dynamo > /dev/null
  dyn_key=$(dyn_admin issue-key --tenant sdk-dynamo | tail -n 1)
  dyn_admin create-tenant --name sdk-dynamo-quota > /dev/null
  dyn_limited=$(dyn_admin issue-key --tenant sdk-dynamo-quota | tail -n 1)
  dyn_admin limits --key "$dyn_limited" --rpm 0 > /dev/null
  PYTHONPATH="$work/py" TF_BASE_URL="http://127.0.0.1:$dyn_port" TF_API_KEY="$dyn_key" \
    TF_LIMITED_KEY="$dyn_limited" TF_BIN="$root/target/debug/tokenfactory" DATABASE_URL="$dyn_url" \
    TF_USAGE_TENANT=sdk-dynamo TF_CHAT_MODEL="$dyn_model" TF_SIMULATOR=0 TF_LABEL="Dynamo at $TF_DYNAMO_URL" \
    TF_EMBED_MODEL="" TF_EMBED_SKIP_REASON="Dynamo's mocker serves no embedding model (its frontend answers /v1/embeddings 404 Model not found)" \
    python3 end2end/sdk_endpoints.py || { tail -20 "$work/dyn-serve.err" >&2; exit 1; }
fi

# The portal in a real browser, JavaScript off.
echo "end2end: the portal in Chromium" >&2
(cd end2end && npm ci --loglevel=error --no-audit --no-fund)
(cd end2end && TF_BASE_URL="http://127.0.0.1:$port" TF_EMAIL="$email" TF_PASSWORD="$password" TF_API_KEY="$key" \
  TF_ADMIN_EMAIL="$admin_email" TF_ADMIN_PASSWORD="$admin_password" npm test)
