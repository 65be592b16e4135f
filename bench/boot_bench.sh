#!/usr/bin/env bash
# Boot benchmark: time from spawning QEMU to the guest agent answering its handshake,
# and the guest kernel's own uptime at that moment, over N boots of the base image.
# Baseline in the same run: the same kernel booted to its first console line with no rootfs
# (bare QEMU + kernel start-up), so machine noise shows in both columns.
# Usage: bench/boot_bench.sh [runs] [accel]     (defaults: 10 tcg)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
accel=${2:-tcg}
bin=build/bin/space-vm
kernel=build/images/vmlinux
[[ -x $bin && -e $kernel ]] || { echo "run 'make build images' first" >&2; exit 1; }

ready=() init=() bare=()
for ((i = 0; i < runs; i++)); do
  out=$($bin run --accel "$accel" --cpus 2 --memory 512 --json -- true)
  ready+=("$(jq -r .boot.ready_ms <<<"$out")")
  init+=("$(jq -r .boot.guest_uptime_at_init_s <<<"$out")")
  # Baseline: kernel alone until it panics for want of a root disk (QEMU exits, -no-reboot).
  t0=$(date +%s%N)
  qemu-system-x86_64 -machine microvm,acpi=off,x-option-roms=off,isa-serial=on -nodefaults -no-user-config \
    -nographic -no-reboot -accel tcg,thread=multi -cpu max -smp 2 -m 512M -kernel "$kernel" \
    -append "console=ttyS0 panic=-1 reboot=t root=/dev/vda" -serial null >/dev/null 2>&1 || true
  bare+=("$((($(date +%s%N) - t0) / 1000000))")
done

stats() { # prints p50 p90 max of the numbers given: nearest rank, ceil(q*n), as bench/percentiles.h
  printf '%s\n' "$@" | sort -g | awk '
    function rank(q,  r) { r = q * NR; r = (r == int(r)) ? r : int(r) + 1; return r < 1 ? 1 : r }
    {a[NR]=$1} END {printf "p50=%s p90=%s max=%s", a[rank(0.5)], a[rank(0.9)], a[NR]}'
}
echo "boot to agent ready (host ms, spawn -> agent handshake)  : $(stats "${ready[@]}")"
echo "guest uptime at init (s):                                   $(stats "${init[@]}")"
echo "baseline: bare kernel to root-mount panic + exit (host ms):  $(stats "${bare[@]}")"
