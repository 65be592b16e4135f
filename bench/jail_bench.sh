#!/usr/bin/env bash
# What the jail costs a QEMU start: spawn -> QMP socket listening, for a bare
# `qemu-system-x86_64 -machine microvm -nodefaults -S`, started directly, through space-jail
# (no core dumps, no_new_privs, and a cgroup of its own in each v1 hierarchy or the v2 one), and
# through space-jail with its view (pid 1 of a new PID namespace, made by `unshare --pid --fork`
# here as spaced's clone does; a private mount namespace; no capabilities), alternating, N times
# each. Needs root (cgroups, namespaces). Prints p50 / p90 / max in ms.
#   bench/jail_bench.sh [N] [BUILD_DIR]
set -euo pipefail
n=${1:-30}
build=${2:-build}
jail="$build/bin/space-jail"
[ -x "$jail" ] || { echo "jail_bench: $jail is missing (make build)" >&2; exit 1; }
work=$(mktemp -d /tmp/space-jail-bench-XXXXXX)
groups=()
cleanup() {
  pkill -f "$work/" 2>/dev/null || true
  sleep 0.2
  for g in "${groups[@]}"; do rmdir "$g" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The VMs' group in each hierarchy that has memory, pids or cpu: beside our own group, as spaced does.
for c in memory pids cpu; do
  mount_point=$(awk -v c="$c" '{ for (i = 7; i <= NF; i++) if ($i == "-") break;
    if ($(i + 1) == "cgroup" && ("," $(i + 3) ",") ~ ("," c ",")) { print $5; exit } }' /proc/self/mountinfo)
  [ -n "$mount_point" ] || continue
  own=$(awk -F: -v c="$c" '("," $2 ",") ~ ("," c ",") {print $3; exit}' /proc/self/cgroup)
  g="$mount_point${own%/}/space-jail-bench-$$"
  mkdir -p "$g"
  groups+=("$g")
done
if [ ${#groups[@]} -eq 0 ]; then
  mount_point=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; if ($(i + 1) == "cgroup2") { print $5; exit } }' \
    /proc/self/mountinfo)
  own=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
  g="$mount_point${own%/}/space-jail-bench-$$"
  mkdir -p "$g"
  groups+=("$g")
fi
jail_args=(--nofile 4096)
for g in "${groups[@]}"; do jail_args+=(--cgroup-procs "$g/cgroup.procs"); done

now_us() { echo $(($(date +%s%N) / 1000)); }
start_once() {  # $1: direct|jailed; prints microseconds from spawn to the QMP socket
  local sock="$work/qmp-$RANDOM$RANDOM.sock"
  local qemu=(qemu-system-x86_64 -machine microvm -nodefaults -no-user-config -display none -S
    -qmp "unix:$sock,server=on,wait=off")
  local t0 pid
  t0=$(now_us)
  if [ "$1" = jailed ]; then
    "$jail" "${jail_args[@]}" -- "${qemu[@]}" >/dev/null 2>&1 &
  elif [ "$1" = view ]; then
    unshare --pid --fork --kill-child "$jail" "${jail_args[@]}" --view --rw "$work" --dev /dev/null \
      --dev /dev/urandom --no-caps -- "${qemu[@]}" >/dev/null 2>&1 &
  else
    "${qemu[@]}" >/dev/null 2>&1 &
  fi
  pid=$!
  until [ -S "$sock" ]; do :; done
  echo $(($(now_us) - t0))
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$sock"
}

direct=()
jailed=()
viewed=()
start_once direct >/dev/null  # warm the page cache
for _ in $(seq "$n"); do
  direct+=("$(start_once direct)")
  jailed+=("$(start_once jailed)")
  viewed+=("$(start_once view)")
done
summary() {
  sort -n | awk '{v[NR] = $1} END {
    p50 = v[int((NR * 50 + 99) / 100)]; p90 = v[int((NR * 90 + 99) / 100)];
    printf "p50 %.1f ms, p90 %.1f ms, max %.1f ms (n=%d)\n", p50 / 1000, p90 / 1000, v[NR] / 1000, NR }'
}
echo "cgroups: ${groups[*]}"
echo "QEMU start -> QMP socket, direct:            $(printf '%s\n' "${direct[@]}" | summary)"
echo "QEMU start -> QMP socket, through space-jail: $(printf '%s\n' "${jailed[@]}" | summary)"
echo "QEMU start -> QMP socket, jail with its view: $(printf '%s\n' "${viewed[@]}" | summary)"
