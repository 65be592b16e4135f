#!/usr/bin/env bash
# The image cache's contract (images/lib.sh), on a scratch cache: one build of a kind at a time
# (a second waits on the lock), temp dirs of a killed build are swept under the lock, an
# artifact appears in one rename (never half-built), and old entries of a kind are evicted
# newest-first-kept. Prints "N passed, N failed" and exits non-zero on any failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export SPACE_IMAGE_CACHE
SPACE_IMAGE_CACHE=$(mktemp -d /tmp/space-cache-test-XXXXXX)
trap 'rm -rf "$SPACE_IMAGE_CACHE"' EXIT
passed=0 failed=0
check() { # check NAME COMMAND...: one assertion
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $name" >&2
  fi
}

# --- the lock: a second holder waits until the first lets go
(
  source "$here/../../images/lib.sh"
  lock_kind widget
  touch "$SPACE_IMAGE_CACHE/first-has-lock"
  sleep 2
  echo first >>"$SPACE_IMAGE_CACHE/order"
) 2>/dev/null &
first=$!
for _ in $(seq 100); do [[ -e $SPACE_IMAGE_CACHE/first-has-lock ]] && break; sleep 0.05; done
start=$(date +%s.%N)
(
  source "$here/../../images/lib.sh"
  lock_kind widget
  echo second >>"$SPACE_IMAGE_CACHE/order"
) 2>"$SPACE_IMAGE_CACHE/second.err"
waited=$(echo "$(date +%s.%N) - $start" | bc)
wait "$first"
check "the second build waited for the first" test "$(tr '\n' ' ' <"$SPACE_IMAGE_CACHE/order")" = "first second "
check "it waited about as long as the first held the lock ($waited s)" test "$(echo "$waited > 1.0" | bc)" = 1
check "it said it was waiting" grep -q "waiting for another build of widget" "$SPACE_IMAGE_CACHE/second.err"

# --- a killed build's temp dir is swept under the lock; other kinds' are not
(
  source "$here/../../images/lib.sh"
  make_workdir widget >/dev/null
  make_workdir gadget >/dev/null
)
check "temp dirs exist before" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name '.tmp-*' | wc -l)" = 2
( source "$here/../../images/lib.sh"; lock_kind widget ) 2>/dev/null
check "the widget temp dir was swept" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name '.tmp-widget-*' | wc -l)" = 0
check "the gadget temp dir was kept" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name '.tmp-gadget-*' | wc -l)" = 1

# --- publish: one rename; the kernel kind keeps the 2 newest, rootfs the 4 newest
publish_one() { # publish_one KIND HASH
  (
    source "$here/../../images/lib.sh"
    work=$(make_workdir "$1")
    mkdir "$work/out" && echo "$2" >"$work/out/payload"
    publish "$work/out" "$SPACE_IMAGE_CACHE/$1-$2"
    rm -rf "$work"
  ) 2>/dev/null
}
for h in a1 a2 a3; do
  publish_one kernel "$h"
  sleep 0.05 # distinct mtimes: eviction goes by mtime
done
check "the published artifact is whole" test "$(cat "$SPACE_IMAGE_CACHE/kernel-a3/payload")" = a3
check "kernel: the two newest are kept" test -d "$SPACE_IMAGE_CACHE/kernel-a2" -a -d "$SPACE_IMAGE_CACHE/kernel-a3"
check "kernel: the oldest was evicted" test ! -e "$SPACE_IMAGE_CACHE/kernel-a1"
for h in r1 r2 r3 r4 r5; do
  publish_one rootfs "$h"
  sleep 0.05
done
check "rootfs: four kept" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -type d -name 'rootfs-*' | wc -l)" = 4
check "rootfs: the oldest evicted" test ! -e "$SPACE_IMAGE_CACHE/rootfs-r1"
check "eviction never touches another kind" test -d "$SPACE_IMAGE_CACHE/kernel-a3"
# Republishing a hash replaces it whole.
publish_one kernel a3
check "a republished artifact replaces the old one" test "$(cat "$SPACE_IMAGE_CACHE/kernel-a3/payload")" = a3
check "no temp dir is left behind" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name '.tmp-kernel-*' | wc -l)" = 0

# --- an entry a running spaced holds (a shared flock on its manifest) is never pruned
for h in b1 b2; do
  publish_one gadget "$h"
  sleep 0.05
done
echo '{}' >"$SPACE_IMAGE_CACHE/gadget-b1/manifest.json"
exec 8<"$SPACE_IMAGE_CACHE/gadget-b1/manifest.json"
flock -s 8
for h in b3 b4; do
  publish_one gadget "$h"
  sleep 0.05
done
check "an entry in use is kept past the count" test -d "$SPACE_IMAGE_CACHE/gadget-b1"
check "the one not in use was pruned" test ! -e "$SPACE_IMAGE_CACHE/gadget-b2"
exec 8<&-
publish_one gadget b5
check "once let go, it is pruned" test ! -e "$SPACE_IMAGE_CACHE/gadget-b1"
check "the newest two remain" test -d "$SPACE_IMAGE_CACHE/gadget-b4" -a -d "$SPACE_IMAGE_CACHE/gadget-b5"

# --- an entry a data dir's saved sandboxes stand on (a pin naming that dir) is kept while the
# dir is a data dir (its spaced.lock), whether or not a spaced runs, and while the dir cannot be
# seen at all (its parent missing: not mounted now); a pin of a dir that is plainly gone, or of
# a directory that is no data dir, keeps nothing
for h in c1 c2 c3 c4; do
  publish_one widget "$h"
  sleep 0.05
done
datadir=$SPACE_IMAGE_CACHE/a-data-dir
mkdir -p "$datadir" "$SPACE_IMAGE_CACHE/not-a-data-dir"
touch "$datadir/spaced.lock"
pin_on() { # pin_on ENTRY TARGET
  mkdir -p "$SPACE_IMAGE_CACHE/$1/pins"
  echo "$2" >"$SPACE_IMAGE_CACHE/$1/pins/0123456789abcdef"
}
pin_on widget-c1 "$datadir"
pin_on widget-c2 "$SPACE_IMAGE_CACHE/gone-data-dir"
pin_on widget-c3 "$SPACE_IMAGE_CACHE/not-a-data-dir"
pin_on widget-c4 "/nonexistent-mount-$$/data"
for h in c5 c6; do
  publish_one widget "$h"
  sleep 0.05
done
check "a pinned entry is kept past the count" test -d "$SPACE_IMAGE_CACHE/widget-c1"
check "an entry pinned by a data dir that is gone was pruned" test ! -e "$SPACE_IMAGE_CACHE/widget-c2"
check "an entry pinned by a directory that is no data dir was pruned" test ! -e "$SPACE_IMAGE_CACHE/widget-c3"
check "an entry pinned by a data dir that cannot be seen now is kept" test -d "$SPACE_IMAGE_CACHE/widget-c4"
(
  source "$here/../../images/lib.sh"
  publish "$(make_workdir widget)" "$SPACE_IMAGE_CACHE/widget-c7"
) 2>"$SPACE_IMAGE_CACHE/pin.err"
check "the prune said why it kept it" grep -q "keeping old widget-c1: saved sandboxes of $datadir stand on it" \
  "$SPACE_IMAGE_CACHE/pin.err"
check "no entry was left aside" test "$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name '.tmp-widget-*' | wc -l)" = 0
rm -rf "$datadir"
publish_one widget c8
check "once its data dir is gone, it is pruned" test ! -e "$SPACE_IMAGE_CACHE/widget-c1"

echo "$passed passed, $failed failed"
((failed == 0))
