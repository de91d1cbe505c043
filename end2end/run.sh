#!/usr/bin/env bash
# End-to-end checks of the product as a user runs it: `tokenfactory serve` on its embedded
# default (on a scratch database and port), the official openai Python package streaming through
# it with the printed key, the openai and anthropic packages on Responses, Embeddings and
# Messages, and the portal login in Debian's Chromium with JavaScript off.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
db="tokenfactory_e2e_$$"
port=$((20000 + RANDOM % 20000))

if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
command -v npm >/dev/null 2>&1 || { SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null; }

cargo build -q -p tokenfactory
DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" TF_LISTEN="127.0.0.1:$port" \
  TF_METRICS_LISTEN="127.0.0.1:0" TF_JOURNAL_DIR="$work/journal" TF_REDIS_PREFIX="e2e:$$:" TF_DEMO_STATE="$work/demo.json" \
  target/debug/tokenfactory serve --demo --allow-owner-role > "$work/serve.log" 2> "$work/serve.err" &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 120); do grep -q "API key:" "$work/serve.log" 2>/dev/null && break; sleep 0.5; done
grep -q "API key:" "$work/serve.log" || { cat "$work/serve.err" >&2; exit 1; }
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

# The portal in a real browser, JavaScript off.
(cd end2end && npm ci --silent --no-audit --no-fund)
(cd end2end && TF_BASE_URL="http://127.0.0.1:$port" TF_EMAIL="$email" TF_PASSWORD="$password" TF_API_KEY="$key" \
  TF_ADMIN_EMAIL="$admin_email" TF_ADMIN_PASSWORD="$admin_password" npm test)
