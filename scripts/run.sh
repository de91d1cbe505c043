#!/usr/bin/env bash
# Runs Token Factory on its embedded default: simulated fleet, demo tenant, printed login and key.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
exec cargo run --release -p tokenfactory -- serve --demo "$@"
