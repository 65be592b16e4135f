#!/usr/bin/env bash
# The E2B SDK suite: installs the pinned e2b package from the npm registry (once; npm's cache
# keeps it outside the clone), starts a real spaced on its own data dir and ports, and runs
# sdk.test.mjs against it with node's test runner.
#   tests/e2b/run.sh BUILD_DIR [IMAGES_DIR]   (images default: BUILD_DIR/images)
# E2B_SUITE=FILE runs that node script instead of the test suite (the benchmarks in bench/ do),
# with SPACED_ARGS added to spaced's arguments.
# The gateways' upstream side is a network namespace with nothing but loopback, so no guest
# packet can leave this machine whatever a test does.
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR [IMAGES_DIR]}" && pwd)
images=${2:-$build/images}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/start_spaced.sh"

version=$(node -p 'process.versions.node')
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||a==22||(a==20&&b>=18)||a==21?0:1)'; then
  echo "run.sh: the e2b SDK needs Node.js >= 20.18.1 (this is $version)" >&2
  exit 1
fi
# Installed again whenever the lock file changed (node_modules/.space-lock is the one installed).
if ! cmp -s "$here/package-lock.json" "$here/node_modules/.space-lock" 2>/dev/null; then
  timeout 300 npm ci --prefix "$here" --no-audit --no-fund --loglevel=error
  cp "$here/package-lock.json" "$here/node_modules/.space-lock"
fi

work=$(mktemp -d /tmp/e2b-sdk-XXXXXX)
netns=space-e2b-sdk-$$
spaced_pid=
cleanup() {
  if [[ -n $spaced_pid ]]; then
    kill -TERM "$spaced_pid" 2>/dev/null || true
    wait "$spaced_pid" 2>/dev/null || true
  fi
  ip netns delete "$netns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$netns"
ip -n "$netns" link set lo up

# shellcheck disable=SC2086 # SPACED_ARGS: words
start_spaced "$build" "$work" --e2b-api-listen 127.0.0.1:0 --e2b-envd-listen 127.0.0.1:0 \
  --kernel "$images/vmlinux" --rootfs "$images/rootfs.ext4" --qemu "$images/qemu-system-x86_64" --warm-pool 0 --warm-pool-budget-mb 0 \
  --gateway-upstream-netns "/run/netns/$netns" --gateway-upstream-dns 192.0.2.53 ${SPACED_ARGS:-}
E2B_API_URL=$(jq -r .e2b_api_url "$work/data/spaced.json")
E2B_SANDBOX_URL=$(jq -r .e2b_sandbox_url "$work/data/spaced.json")
E2B_API_KEY=$(head -1 "$work/data/api-key")
SPACE_API=$(jq -r .url "$work/data/spaced.json")  # to check what the E2B calls did in SPACE's terms
export E2B_API_URL E2B_SANDBOX_URL E2B_API_KEY SPACE_API
unset E2B_DEBUG E2B_DOMAIN
status=0
export SPACED_PID=$spaced_pid E2B_SDK=$here/node_modules/e2b/dist/index.mjs
if [[ -n ${E2B_SUITE:-} ]]; then
  suite=$(realpath "$E2B_SUITE")
  (cd "$here" && node "$suite") || status=$?
else
  (cd "$here" && node --test --test-concurrency=1 sdk.test.mjs) || status=$?
fi
if ((status != 0)); then
  echo "--- spaced log (tail) ---" >&2
  tail -80 "$work/spaced.log" >&2
fi
exit "$status"
