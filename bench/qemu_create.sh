#!/usr/bin/env bash
# The create path through spaced with Debian's QEMU against SPACE's (images/build-qemu.sh,
# spaced's default): space-api-bench without a warm pool, so that every create starts a QEMU
# (restore from the template) on the request's path, PAIRS times each, alternating.
#
#   bench/qemu_create.sh [BUILD_DIR] [PAIRS] [CREATES]      (defaults: build 4 20)
#
# Prints one table: for each measure, the median over the pairs of each run's p50, and the ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
pairs=${2:-4}
creates=${3:-20}
bench=$build/bin/space-api-bench
[[ -x $bench ]] || { echo "qemu_create: $bench is missing (make build first)" >&2; exit 1; }
debian=$(command -v qemu-system-x86_64) || { echo "qemu_create: no qemu-system-x86_64 in PATH" >&2; exit 1; }
space=$(readlink -f "$build/images/qemu-system-x86_64") || true
[[ -x $space ]] || { echo "qemu_create: no $build/images/qemu-system-x86_64 (make images first)" >&2; exit 1; }
work=$(mktemp -d /tmp/space-qemu-create.XXXXXX)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$pairs"); do
  for which in debian space; do
    binary=$debian
    [[ $which == space ]] && binary=$space
    echo "qemu_create: pair $i/$pairs: $which ($binary)" >&2
    # spdlog's lines go to stdout too: the JSON object is what follows them.
    "$bench" --creates "$creates" --execs $((creates * 2)) --warm-pool 0 --qemu "$binary" --json 2>/dev/null |
      sed -n '/^{/,$p' >"$work/$which-$i.json"
  done
done
python3 - "$work" "$pairs" <<'PY'
import json, statistics, sys
work, pairs = sys.argv[1], int(sys.argv[2])
rows = [
    ("baseline: bare QEMU spawn -> QMP answering", "baseline_qemu_start_floor_ms"),
    ("baseline: restore, Vm::start in-process", "baseline_vm_restore_ms"),
    ("  of which QEMU spawn -> guest running", "baseline_vm_restore_running_ms"),
    ("baseline: cold boot, Vm::start in-process", "baseline_vm_start_ms"),
    ("POST /v1/sandboxes -> 201 running", "api_create_ms"),
    ("POST /v1/sandboxes + first exec argv `true`", "api_create_first_exec_ms"),
    ("POST /v1/sandboxes + first exec shell `true`", "api_create_first_exec_shell_ms"),
    ("POST .../exec argv `true` (running sandbox)", "api_exec_true_ms"),
    ("POST .../exec shell `true` (running sandbox)", "api_exec_shell_true_ms"),
    ("DELETE /v1/sandboxes/{id} -> 204", "api_delete_ms"),
]
print("| measure (p50, ms; median of %d runs) | Debian's QEMU | SPACE's QEMU | SPACE / Debian |" % pairs)
print("|---|---|---|---|")
for label, key in rows:
    med = {}
    for which in ("debian", "space"):
        med[which] = statistics.median(
            json.load(open(f"{work}/{which}-{i}.json"))[key]["p50"] for i in range(1, pairs + 1))
    print(f"| {label} | {med['debian']:.1f} | {med['space']:.1f} | {med['space'] / med['debian']:.2f} |")
PY
