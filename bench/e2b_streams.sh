#!/usr/bin/env bash
# 500 concurrent E2B streams by default (10 sandboxes x 50 background commands) against a real
# spaced: see bench/e2b_streams.mjs. Usage: bench/e2b_streams.sh [SANDBOXES] [COMMANDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export SANDBOXES=${1:-10} COMMANDS=${2:-50}
# One process, one envd origin: the SDK's undici pool must allow a connection per stream.
export E2B_ENVD_RPC_CONNECTIONS=$((SANDBOXES * COMMANDS + 50))
export E2B_SUITE=$root/bench/e2b_streams.mjs
export SPACED_ARGS="--default-cpus 1 --default-memory-mb 256 --max-vcpus $((SANDBOXES + 2)) --max-sandboxes $((SANDBOXES + 2))"
exec "$root/tests/e2b/run.sh" "$root/build"
