#!/usr/bin/env bash
# Debian's QEMU against the minimal build (images/build-qemu.sh), side by side: start-up (bare
# floor, Vm::prepare, Vm::restore) and an idle restored guest's PSS, from space-qemu-bench runs
# that alternate the two binaries (PAIRS pairs; each run: ROUNDS start-up rounds, one guest
# left idle 5 s). Both restore the same template, saved by Debian's QEMU.
#
#   bench/qemu_minimal.sh [BUILD_DIR] [PAIRS] [ROUNDS]      (defaults: build 4 10)
#
# Prints one table (medians over all samples of each binary, and their ratio).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
pairs=${2:-4}
rounds=${3:-10}
bench=$build/bin/space-qemu-bench
[[ -x $bench ]] || { echo "qemu_minimal: $bench is missing (make build first)" >&2; exit 1; }
debian=$(command -v qemu-system-x86_64) || { echo "qemu_minimal: no qemu-system-x86_64 in PATH" >&2; exit 1; }
minimal=$("$root/images/build-qemu.sh")/qemu-system-x86_64

work=$(mktemp -d /tmp/space-qemu-minimal.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "qemu_minimal: debian $debian ($(stat -c %s "$debian") bytes, $(ldd "$debian" | wc -l) shared objects)" >&2
echo "qemu_minimal: minimal $minimal ($(stat -c %s "$minimal") bytes, $(ldd "$minimal" | wc -l) shared objects)" >&2
# The template, made once by Debian's QEMU (as spaced makes them today).
"$bench" --qemu "$debian" --template "$work/template" --startup 1 >/dev/null
for i in $(seq 1 "$pairs"); do
  for which in debian minimal; do
    binary=$debian
    [[ $which == minimal ]] && binary=$minimal
    echo "qemu_minimal: pair $i/$pairs: $which" >&2
    # spdlog's lines go to stdout too: the JSON object is what follows them.
    "$bench" --qemu "$binary" --template "$work/template" --startup "$rounds" --memory-rounds 1 --variants default \
      --idle-s 5 --steady 6 --json | sed -n '/^{/,$p' >"$work/$which-$i.json"
  done
done
python3 - "$work" <<'PY'
import glob, json, statistics, sys
work = sys.argv[1]
rows = [("bare QEMU spawn -> QMP answering (ms)", ("startup", "bare_qemu_floor_ms")),
        ("Vm::prepare (ms)", ("startup", "vm_prepare_ms")),
        ("  of which QEMU spawn -> QMP (ms)", ("startup", "vm_prepare_spawn_to_qmp_ms")),
        ("Vm::restore (ms)", ("startup", "vm_restore_ms")),
        ("first argv exec after restore (ms)", ("memory", "default", "first_argv_ms")),
        ("argv exec, steady (ms)", ("memory", "default", "argv_ms")),
        ("idle pooled guest PSS, total (MiB)", ("memory", "default", "pooled_pss_mib", "total")),
        ("  of which files: QEMU and its libraries (MiB)", ("memory", "default", "pooled_pss_mib", "files")),
        ("  of which heap + other anonymous (MiB)", ("memory", "default", "pooled_pss_mib", "anon_other"))]
def values(which, path):
    out = []
    for f in sorted(glob.glob(f"{work}/{which}-*.json")):
        o = json.load(open(f))
        for k in path: o = o[k]
        out += o["samples"] if isinstance(o, dict) else [o]
    return out
print(f"| measure | Debian's QEMU p50 | minimal p50 | minimal / Debian |")
print(f"|---|---|---|---|")
for name, path in rows:
    d, m = statistics.median(values("debian", path)), statistics.median(values("minimal", path))
    print(f"| {name} | {d:.1f} | {m:.1f} | {m / d:.2f} |")
PY
