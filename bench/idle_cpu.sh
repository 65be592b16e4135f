#!/usr/bin/env bash
# idle_cpu.sh: how much host CPU an idle SPACE guest costs (issue 11, "hot pool").
#
# Measures a QEMU process's CPU time (utime+stime from /proc/<pid>/stat, the whole process, exited
# threads included) over windows of N seconds after a settle time, and per thread (schedstat ns,
# context switches: a vCPU thread's voluntary switches are, nearly one for one, the times the
# guest went idle and was woken again). Prints each window and the median, as % of one host core.
# With --guest it also shows what woke the guest during the window, seen from inside: interrupts,
# softirqs and context switches per guest task, per second, and the clocksource.
#
# Three ways to get a guest (root, local, no network):
#   bench/idle_cpu.sh --pid PID                          a QEMU already running
#   bench/idle_cpu.sh --space-vm [BIN] [-- ARGS...]      boot one with `space-vm run` (its command
#                                                        sleeps through the windows); ARGS go to
#                                                        `space-vm run`, e.g. --cpus 1 --cmdline "..."
#   bench/idle_cpu.sh --spaced URL --key KEY             create a sandbox (default size) through the
#                                                        API, measure it with no call running, delete it
# Options: -d SECONDS window (60), -s SECONDS settle (20), -n N windows (3), --guest, --quiet,
#   --load CMD (space-vm only): run CMD in the guest's background throughout, e.g. a loop that
#   wakes N times a second, to price one guest wakeup.
# Compare changes side by side in one session: the host's other load shifts the numbers.
#
# Reading it (TCG, 2 vCPUs, 2026-12-01): a guest whose clocksource is refined-jiffies (its TSC
# calibration against the emulated PIT failed at boot, or in the boot its template was saved
# from) has no tickless idle: 500 timer interrupts/s, about 5% of a core. On tsc: about 0.13%,
# most of it the agent's 1 s timer; without that timer about 0.02%.
set -euo pipefail

duration=60
settle=20
windows=3
guest=0
quiet=0
load=""
mode=""
pid=""
space_vm_bin=""
vm_args=()
url=""
key=""

die() { echo "idle_cpu: $*" >&2; exit 2; }
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --pid) mode=pid; pid="${2:?}"; shift 2 ;;
    --space-vm)
      mode=space-vm; shift
      if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then space_vm_bin="$1"; shift; fi ;;
    --spaced) mode=spaced; url="${2:?}"; shift 2 ;;
    --key) key="${2:?}"; shift 2 ;;
    -d) duration="${2:?}"; shift 2 ;;
    -s) settle="${2:?}"; shift 2 ;;
    -n) windows="${2:?}"; shift 2 ;;
    --guest) guest=1; shift ;;
    --quiet) quiet=1; shift ;;
    --load) load="${2:?}"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; vm_args=("$@"); break ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[ -n "$mode" ] || usage 2
[ "$(id -u)" = 0 ] || [ "$mode" = pid ] || die "run as root"
case "$duration$settle$windows" in *[!0-9]*) die "-d, -s and -n take whole numbers" ;; esac
[ "$windows" -ge 1 ] && [ "$duration" -ge 1 ] || die "-d and -n must be at least 1"

log() { [ "$quiet" = 1 ] || echo "$@" >&2; }
work=$(mktemp -d /tmp/idle_cpu.XXXXXX)
child=""
child_qemu=""
sandbox=""
cleanup() {
  if [ -n "$sandbox" ]; then
    curl -s -o /dev/null -X DELETE -H "Authorization: Bearer $key" "$url/v1/sandboxes/$sandbox" || true
  fi
  # Interrupted: stop the QEMU that our space-vm started (checked by pid and start time), so
  # space-vm sees the VM end and removes its run directory itself; kill space-vm only if it stays.
  if [ -n "$child_qemu" ] && [ "$(cut -d' ' -f22 "/proc/${child_qemu%%:*}/stat" 2>/dev/null)" = "${child_qemu#*:}" ]; then
    kill "${child_qemu%%:*}" 2>/dev/null || true
  fi
  if [ -n "$child" ]; then
    for ((i = 0; i < 100; i++)); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
    kill "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ticks=$(getconf CLK_TCK)

# One line per process: utime+stime in ticks (field 14+15 after the "(comm)" field).
proc_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

# One line per live thread: tid, ns on CPU, context switches (voluntary nonvoluntary), comm.
thread_snapshot() {
  local t comm
  for t in /proc/"$1"/task/*; do
    [ -r "$t/schedstat" ] || continue
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    printf '%s %s %s %s %s\n' "${t##*/}" \
      "$(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)" \
      "$(awk '/^voluntary_ctxt_switches/{print $2}' "$t/status" 2>/dev/null || echo 0)" \
      "$(awk '/^nonvoluntary_ctxt_switches/{print $2}' "$t/status" 2>/dev/null || echo 0)" \
      "${comm// /_}"
  done
}

# Per-thread deltas between two snapshots, grouped by thread name.
thread_report() {  # before after seconds
  awk -v secs="$3" '
    NR == FNR { ns[$1] = $2; vol[$1] = $3; inv[$1] = $4; next }
    {
      dns = $2 - ns[$1]; dv = $3 - vol[$1]; di = $4 - inv[$1]
      if (!($1 in ns)) { dns = $2; dv = $3; di = $4 }
      name = $5; sub(/^worker.*/, "worker", name)
      gns[name] += dns; gv[name] += dv; gi[name] += di; seen[name] = 1
    }
    END {
      for (n in seen) printf "    %-18s %6.2f%% of a core  %7.1f wakeups/s  %5.1f preemptions/s\n",
        n, gns[n] / (secs * 1e7), gv[n] / secs, gi[n] / secs
    }' "$1" "$2" | sort -k2 -rn
}

median() { sort -n | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# What the guest runs to describe itself (as root). Raw counters; the host computes the deltas.
guest_snapshot_script='
echo "@uptime"; cat /proc/uptime
echo "@interrupts"; cat /proc/interrupts
echo "@softirqs"; cat /proc/softirqs
echo "@tasks"; awk "FNR == 1 {n = \"\"} /^Name:/ {sub(/^Name:[ \t]*/, \"\"); gsub(/ /, \"_\"); n = \$0} /^Pid:/ {p = \$2} /^voluntary_ctxt_switches/ {v = \$2} /^nonvoluntary_ctxt_switches/ {print p, n, v + \$2}" /proc/[0-9]*/task/[0-9]*/status 2>/dev/null
echo "@end"'
guest_info_script='
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
echo "clockevent: $(cat /sys/devices/system/clockevents/clockevent0/current_device 2>/dev/null)"
echo "hrtimer resolution: $(awk "/\.resolution/ {print \$3, \$4; exit}" /proc/timer_list 2>/dev/null)"
echo "tick mode: $(awk "/\.nohz_mode/ {print \$3; exit}" /proc/timer_list 2>/dev/null) (0 inactive, 1 lowres, 2 highres)"
echo "tsc at boot: $(dmesg 2>/dev/null | grep -oE "tsc: (Fast TSC calibration [a-zA-Z ]*|Unable to calibrate [a-zA-Z ]*|Marking TSC unstable [a-zA-Z ]*|Detected [0-9.]+ MHz)" | tr "\n" ";")"
echo "cmdline: $(cat /proc/cmdline)"'

# Deltas between two guest snapshots (sections in one file each), per second of guest uptime.
guest_report() {  # before after
  awk '
    FNR == 1 { file++ }
    /^@/ { sec = substr($0, 2); next }
    sec == "uptime" { up[file] = $1; next }
    sec == "interrupts" {
      if ($1 ~ /^CPU/) next
      key = $1; s = 0; i = 2
      while (i <= NF && $i ~ /^[0-9]+$/) { s += $i; i++ }
      name = ""; for (; i <= NF; i++) name = name " " $i
      irq[file, key] = s; iname[key] = name; next
    }
    sec == "softirqs" {
      if ($1 ~ /^CPU/) next
      s = 0; for (i = 2; i <= NF; i++) s += $i
      sirq[file, $1] = s; skeys[$1] = 1; next
    }
    sec == "tasks" { sw[file, $1] = $3; tname[$1] = $2; tkeys[$1] = 1; next }
    END {
      secs = up[2] - up[1]; if (secs <= 0) secs = 1
      printf "  guest, over %.0f s of its uptime (per second):\n", secs
      printf "    interrupts:"
      for (k in iname) { d = irq[2, k] - irq[1, k]; if (d > 0) printf " %s%s=%.1f", k, iname[k], d / secs }
      printf "\n    softirqs:"
      for (k in skeys) { d = sirq[2, k] - sirq[1, k]; if (d > 0) printf " %s=%.1f", k, d / secs }
      printf "\n    context switches by task:"
      n = 0
      for (k in tkeys) if ((2, k) in sw) { d = sw[2, k] - ((1, k) in sw ? sw[1, k] : 0); if (d > 0) { line[++n] = sprintf("%.2f %s[%s]", d / secs, tname[k], k) } }
      for (i = 1; i <= n; i++) printf "%s", (i == 1 ? " " : ", ") line[i]
      printf "\n"
    }' "$1" "$2" | awk '
      # sort the "context switches" list, biggest first
      /context switches by task:/ {
        sub(/^    context switches by task: /, ""); m = split($0, a, ", ")
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] + 0 > a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        printf "    context switches by task:"
        for (i = 1; i <= m && i <= 12; i++) printf "%s%s", (i == 1 ? " " : ", "), a[i]
        printf "\n"; next
      }
      { print }'
}

measure() {  # pid
  local p=$1 i t0 t1 a b results=() fine=()
  for ((i = 1; i <= windows; i++)); do
    thread_snapshot "$p" > "$work/th.a"
    t0=$(proc_ticks "$p")
    sleep "$duration"
    kill -0 "$p" 2>/dev/null || die "QEMU $p exited during the measurement"
    t1=$(proc_ticks "$p")
    thread_snapshot "$p" > "$work/th.b"
    a=$(awk -v d="$((t1 - t0))" -v hz="$ticks" -v s="$duration" 'BEGIN {printf "%.2f", 100 * d / hz / s}')
    # The same from the live threads' schedstat (ns, so finer than ticks; misses exited threads).
    b=$(awk -v s="$duration" 'NR == FNR {ns[$1] = $2; next} {d += $2 - ($1 in ns ? ns[$1] : 0)} END {printf "%.3f", d / (s * 1e7)}' "$work/th.a" "$work/th.b")
    results+=("$a")
    fine+=("$b")
    echo "window $i: ${a}% of a core ($((t1 - t0)) ticks of 1/${ticks} s in ${duration} s; threads: ${b}%)"
    [ "$quiet" = 1 ] || thread_report "$work/th.a" "$work/th.b" "$duration"
  done
  printf '%s\n' "${results[@]}" | median > "$work/median"
  echo "median: $(cat "$work/median")% of a core over $windows x ${duration} s (threads: $(printf '%s\n' "${fine[@]}" | median)%)"
}

find_qemu_child() {  # parent pid
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do
    case "$(cat "/proc/$c/comm" 2>/dev/null)" in qemu-system-*) echo "$c"; return 0 ;; esac
  done
  return 1
}

case "$mode" in
pid)
  [ -r "/proc/$pid/stat" ] || die "no process $pid"
  log "settling ${settle} s"
  sleep "$settle"
  measure "$pid"
  ;;

space-vm)
  if [ -z "$space_vm_bin" ]; then
    space_vm_bin="$(cd "$(dirname "$0")/.." && pwd)/build/bin/space-vm"
  fi
  [ -x "$space_vm_bin" ] || die "no space-vm at $space_vm_bin"
  total=$((settle + windows * duration + 5))
  bg=""
  [ -n "$load" ] && bg="( $load ) > /dev/null 2>&1 & "
  # The guest command: settle, mark the start on the console, sleep through the windows, and,
  # with --guest, snapshot its counters around them.
  if [ "$guest" = 1 ]; then
    gcmd="sudo bash -c '$(printf '%s' "$guest_info_script$guest_snapshot_script" | sed "s/'/'\\\\''/g")' > /tmp/idle.a"
    gcmd="${bg}sleep $settle; $gcmd; sudo sh -c 'echo IDLE-BEGIN > /dev/kmsg'; sleep $((windows * duration + 2));"
    gcmd="$gcmd sudo bash -c '$(printf '%s' "$guest_snapshot_script" | sed "s/'/'\\\\''/g")' > /tmp/idle.b; cat /tmp/idle.a; echo @@; cat /tmp/idle.b"
  else
    gcmd="${bg}sleep $settle; sudo sh -c 'echo IDLE-BEGIN > /dev/kmsg'; sleep $((windows * duration + 2))"
  fi
  "$space_vm_bin" run --timeout "$((total + 30))" "${vm_args[@]}" -- "$gcmd" > "$work/out" 2> "$work/err" &
  child=$!
  qemu=""
  for ((i = 0; i < 600; i++)); do
    qemu=$(find_qemu_child "$child") && break
    kill -0 "$child" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$qemu" ] || { cat "$work/err" >&2; die "space-vm started no QEMU"; }
  child_qemu="$qemu:$(cut -d' ' -f22 "/proc/$qemu/stat")"
  console=$(tr '\0' '\n' < "/proc/$qemu/cmdline" | sed -n 's/.*path=\([^,]*console\.log\).*/\1/p' | head -1)
  log "QEMU $qemu, console $console; waiting for the guest to settle (${settle} s after boot)"
  for ((i = 0; i < (settle + 120) * 10; i++)); do
    grep -q IDLE-BEGIN "$console" 2>/dev/null && break
    kill -0 "$qemu" 2>/dev/null || { cat "$work/err" >&2; die "QEMU exited before the guest settled"; }
    sleep 0.1
  done
  grep -q IDLE-BEGIN "$console" 2>/dev/null || die "the guest never reached its idle phase"
  measure "$qemu"
  # The guest's command ends 2 s after the last window; space-vm then powers the VM off.
  wait "$child" || true
  child=""
  child_qemu=""
  if [ "$guest" = 1 ]; then
    awk '/^@@$/ {exit} /^@uptime$/ {s = 1} !s {print "  " $0}' "$work/out"
    awk '/^@@$/ {exit} /^@uptime$/ {s = 1} s' "$work/out" > "$work/g.a"
    awk 'f; /^@@$/ {f = 1}' "$work/out" > "$work/g.b"
    if [ -s "$work/g.b" ]; then guest_report "$work/g.a" "$work/g.b"; else echo "  (no guest counters: $(tail -3 "$work/err"))"; fi
  fi
  ;;

spaced)
  [ -n "$key" ] || die "--spaced needs --key"
  api() { curl -sS -f -H "Authorization: Bearer $key" -H 'Content-Type: application/json' "$@"; }
  created=$(api -X POST -d '{}' "$url/v1/sandboxes") || die "create failed"
  sandbox=$(printf '%s' "$created" | sed -n 's/.*"id" *: *"\(sb_[a-z0-9]*\)".*/\1/p')
  [ -n "$sandbox" ] || die "create answered: $created"
  qemu=""
  for c in $(pgrep -f "qemu-system.*$sandbox" || true); do
    case "$(cat "/proc/$c/comm" 2>/dev/null)" in qemu-system-*) qemu=$c ;; esac
  done
  [ -n "$qemu" ] || die "no QEMU process names sandbox $sandbox (is spaced on this host?)"
  log "sandbox $sandbox, QEMU $qemu; settling ${settle} s"
  sleep "$settle"
  measure "$qemu"
  if [ "$guest" = 1 ]; then
    # A second look from inside, with one exec running (its sleep) through one window.
    gcmd="$guest_info_script$guest_snapshot_script; sleep $duration; echo @@; $guest_snapshot_script"
    body=$(jq -n --arg c "$gcmd" --argjson t "$((duration + 60))" '{command: $c, user: "root", timeout_s: $t}')
    api -X POST -d "$body" "$url/v1/sandboxes/$sandbox/exec" | jq -r .stdout > "$work/out" || die "exec failed"
    awk '/^@uptime$/ {exit} {print "  " $0}' "$work/out"
    awk '/^@@$/ {exit} /^@uptime$/ {s = 1} s' "$work/out" > "$work/g.a"
    awk 'f; /^@@$/ {f = 1}' "$work/out" > "$work/g.b"
    guest_report "$work/g.a" "$work/g.b"
  fi
  ;;
esac
