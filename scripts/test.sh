#!/usr/bin/env bash
# Runs every check and test: formatting, lints, unit and integration tests on real PostgreSQL and
# Redis (each test in its own database and key prefix), the browser test when Chromium is there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p tf-app --features ssr --all-targets -- -D warnings

if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi

if [ -d end2end ] && [ -f end2end/package.json ]; then
  end2end/run.sh
fi
