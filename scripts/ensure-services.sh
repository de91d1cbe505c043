#!/usr/bin/env bash
# Makes sure what Token Factory needs is installed and running on this (Debian) machine:
# the Rust toolchain of rust-toolchain.toml, PostgreSQL on 127.0.0.1:5432 and Redis on
# 127.0.0.1:6379. Installs with apt/rustup only what is missing; safe to run repeatedly.
set -euo pipefail

need_apt=()
command -v pg_ctlcluster >/dev/null 2>&1 || need_apt+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if ! command -v rustup >/dev/null 2>&1; then
    echo "Rust is missing: install rustup (https://rustup.rs) and re-run." >&2
    exit 1
  fi
fi
# rust-toolchain.toml pins the toolchain; this installs it (with rustfmt and clippy) if needed.
rustup show active-toolchain >/dev/null 2>&1 || rustup toolchain install

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting PostgreSQL"
  version=$(ls /etc/postgresql | sort -n | tail -1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 >/dev/null || { echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2; exit 1; }

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/tokenfactory.log
  for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 1; done
fi
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null || { echo "Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
