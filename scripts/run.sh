#!/usr/bin/env bash
# Runs Token Factory on its embedded default: simulated fleet, demo tenant, printed login and key.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-services.sh
# The embedded default connects as the local superuser, which also migrates: allowed for a demo.
exec cargo run --release -p tokenfactory -- serve --demo --allow-owner-role "$@"
