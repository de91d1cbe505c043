#!/usr/bin/env bash
# Regenerates `.sqlx/` (the offline query data every build reads, SQLX_OFFLINE=true in
# .cargo/config.toml) after a query or a migration changed; with --check, fails instead when
# `.sqlx/` is stale or a query no longer fits the schema (CI runs that). Both run the migrations
# into a scratch database of the local PostgreSQL, then check every crate and target against it.
# Installs the pinned sqlx-cli (the version of our sqlx) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SQLX_CLI_VERSION=0.8.6
if [ "$(sqlx --version 2>/dev/null || true)" != "sqlx-cli $SQLX_CLI_VERSION" ]; then
  echo "installing sqlx-cli $SQLX_CLI_VERSION"
  cargo install sqlx-cli --version "$SQLX_CLI_VERSION" --locked --no-default-features \
    --features postgres,rustls
fi

server="${SQLX_PREPARE_SERVER:-postgres://postgres@127.0.0.1:5432}"
scratch="tf_sqlx_prepare_$$"
export DATABASE_URL="$server/$scratch"
trap 'sqlx database drop -y >/dev/null 2>&1 || true' EXIT
sqlx database create
sqlx migrate run --source migrations
# --all-targets: tests and benches hold query! too. Not --all-features: tf-app's `hydrate` and
# `ssr` do not build together; `ssr` (where its queries would be) is on through the server.
cargo sqlx prepare --workspace "$@" -- --all-targets
