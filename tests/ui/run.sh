#!/usr/bin/env bash
# The web console's browser test: builds the console (ui/) with its pinned npm packages (installed
# again only when ui/package-lock.json changed; npm's cache outside the clone keeps that off the
# network), starts a real spaced serving that build on its own data dir and port, and drives it
# in headless Chromium with console.test.mjs (node's test runner, playwright-core); units.test.mjs
# checks the console's pure helpers first.
#   tests/ui/run.sh BUILD_DIR [IMAGES_DIR]   (images default: BUILD_DIR/images)
# Screenshots of every step go to BUILD_DIR/ui-artefacts. The sandboxes have no network
# (--network off), and the browser reaches nothing but this spaced on loopback.
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR [IMAGES_DIR]}" && pwd)
images=${2:-$build/images}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/start_spaced.sh"
ui=$(cd "$here/../../ui" && pwd)
chromium=${CHROMIUM:-/usr/bin/chromium}

if [[ ! -x $chromium ]]; then
  echo "run.sh: no Chromium at $chromium (install Debian's chromium package, or set CHROMIUM)" >&2
  exit 1
fi
work=$(mktemp -d /tmp/space-ui-test-XXXXXX)
spaced_pid=
cleanup() {
  if [[ -n $spaced_pid ]]; then
    kill -TERM "$spaced_pid" 2>/dev/null || true
    wait "$spaced_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The same build `make ui` makes (npm ci only when ui/package-lock.json changed).
"$here/../../scripts/build-ui.sh" "$work/ui"
# The pure helpers first (no browser, no VM): a second.
node --test "$here/units.test.mjs"

start_spaced "$build" "$work" --e2b-api-listen off --e2b-envd-listen off --kernel "$images/vmlinux" \
  --rootfs "$images/rootfs.ext4" --qemu "$images/qemu-system-x86_64" --ui-dir "$work/ui" --network off --warm-pool 0 --warm-pool-budget-mb 0
SPACE_API=$(jq -r .url "$work/data/spaced.json")
SPACE_UI_URL=$(jq -r '.console_url // empty' "$work/data/spaced.json")
SPACE_UI_URL=${SPACE_UI_URL:-$SPACE_API/ui/}
SPACE_API_KEY=$(head -1 "$work/data/api-key")
# A second tenant, to see that the console shows it none of the operator's sandboxes or figures.
SPACE_UI_TENANT_KEY=$("$build/bin/spaced" tenant add ui-other --json --data-dir "$work/data" | jq -r .api_key)
SPACE_UI_ARTEFACTS=$build/ui-artefacts
rm -rf "$SPACE_UI_ARTEFACTS"
mkdir -p "$SPACE_UI_ARTEFACTS"
export SPACE_API SPACE_UI_URL SPACE_API_KEY SPACE_UI_TENANT_KEY SPACE_UI_ARTEFACTS CHROMIUM=$chromium
export SPACED_DATA_DIR=$work/data SPACED_BIN=$build/bin/spaced
status=0
(cd "$ui" && node --test --test-concurrency=1 "$here/console.test.mjs") || status=$?
cp "$work/spaced.log" "$SPACE_UI_ARTEFACTS/spaced.log" 2>/dev/null || true
if ((status != 0)); then
  echo "--- spaced log (tail) ---" >&2
  tail -80 "$work/spaced.log" >&2
  echo "(screenshots and the whole log: $SPACE_UI_ARTEFACTS)" >&2
fi
exit "$status"
