#!/usr/bin/env bash
# Builds the web console (ui/) into OUT_DIR: installs ui/'s npm packages as pinned by
# ui/package-lock.json (again only when the lock file changed; npm's cache outside the clone
# keeps a second install off the network), then bundles with ui/build.mjs.
#   scripts/build-ui.sh OUT_DIR
set -euo pipefail
out=${1:?usage: build-ui.sh OUT_DIR}
ui=$(cd "$(dirname "$0")/../ui" && pwd)
if ! cmp -s "$ui/package-lock.json" "$ui/node_modules/.space-lock" 2>/dev/null; then
  echo "build-ui: installing the console's npm packages (ui/package-lock.json)" >&2
  timeout 300 npm ci --prefix "$ui" --no-audit --no-fund --loglevel=error
  cp "$ui/package-lock.json" "$ui/node_modules/.space-lock"
fi
mkdir -p "$out"
tmp=$(mktemp -d "$out.tmp-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
node "$ui/build.mjs" "$tmp"
chmod 755 "$tmp"  # mktemp made it 0700: spaced may read it as another user
# Swapped in whole, so a spaced starting meanwhile never loads half a build.
rm -rf "$out.old"
mv "$out" "$out.old"
mv "$tmp" "$out"
rm -rf "$out.old"
