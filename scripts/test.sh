#!/usr/bin/env bash
# Runs every check and test: formatting, lints, unit and integration tests on real PostgreSQL and
# Redis (each test in its own database and key prefix), the gateway in front of the real NVIDIA
# Dynamo frontend (an optional harness outside this repository, ../shared/dynamo-cpu, used when that
# folder is present; without it the Dynamo tests skip themselves), and the end-to-end checks
# (printed curl line, the openai Python package, the portal in Chromium with JavaScript off).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

# The chart test checks values.yaml against values.schema.json with the JSON Schema reference
# implementation (Python's jsonschema, draft 7 as Helm uses).
python3 -c 'import jsonschema' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check jsonschema

cargo fmt --all -- --check
# Every query! against the migrated schema, and `.sqlx/` up to date (a stale one fails here).
scripts/sqlx-prepare.sh --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p tf-app --features ssr --all-targets -- -D warnings
python3 scripts/import-cycles.py   # no file-level import loop, server/src's layers only point down

dynamo=../shared/dynamo-cpu
if [ -d "$dynamo" ] && [ -z "${TF_DYNAMO_URL:-}" ]; then
  export DYNAMO_DIR="${DYNAMO_DIR:-${TMPDIR:-/tmp}/tf-dynamo-test}"
  bash "$dynamo/setup.sh" > /tmp/tf-dynamo-setup.log 2>&1 || { tail -20 /tmp/tf-dynamo-setup.log; exit 1; }
  # --enable-anthropic-api: the frontend serves /v1/messages (the Messages tests; without it they
  # check the 404 a client gets instead).
  SPEEDUP=20 FRONTEND_ARGS="${FRONTEND_ARGS:---enable-anthropic-api}" bash "$dynamo/start.sh"
  trap 'bash "$dynamo/stop.sh" >/dev/null 2>&1 || true' EXIT
  export TF_DYNAMO_URL="http://127.0.0.1:${HTTP_PORT:-8180}/v1"
fi

if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi

end2end/run.sh
