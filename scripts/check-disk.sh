#!/usr/bin/env bash
# Stops `make run` and `make test` before the build when the disks cannot hold it, saying how much
# is needed and where, instead of failing minutes later in whichever step first finds a disk full
# (a linker's "No space left on device").
#   scripts/check-disk.sh CLONE_MIB CACHE_MIB CLONE_DIR CACHE_DIR [BUILD_DIR...]
# CLONE_MIB: what the builds take in the clone when none exists yet; what BUILD_DIRs already hold
# counts against it. CACHE_MIB: the same for the caches outside the clone (compiles, guest images
# and the kernel's build tree while it builds), against what CACHE_DIR holds. When both are on one
# filesystem, it must hold the sum. SPACE_SKIP_DISK_CHECK=1 skips the check.
set -euo pipefail

if (($# < 4)); then
  echo "usage: $0 CLONE_MIB CACHE_MIB CLONE_DIR CACHE_DIR [BUILD_DIR...]" >&2
  exit 2
fi
[[ ${SPACE_SKIP_DISK_CHECK:-} == 1 ]] && exit 0
clone_mib=$1 cache_mib=$2 clone_dir=$3 cache_dir=$4
shift 4
for n in "$clone_mib" "$cache_mib"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "check-disk: '$n' is not a number of MiB" >&2; exit 2; }
done
mkdir -p "$cache_dir" 2>/dev/null || true

mib_in() { # what the existing ones of the given paths hold, in MiB
  local kib=0 p
  for p in "$@"; do
    [[ -e $p ]] && kib=$((kib + $(du -sk "$p" 2>/dev/null | cut -f1 || echo 0)))
  done
  echo $((kib / 1024))
}
still_needed() { (($1 > $2)) && echo $(($1 - $2)) || echo 0; }

clone_need=$(still_needed "$clone_mib" "$(mib_in "$@")")
cache_need=$(still_needed "$cache_mib" "$(mib_in "$cache_dir")")

check() { # DIR NEED_MIB WHAT
  local free
  free=$(($(df -Pk "$1" | awk 'NR == 2 { print $4 }') / 1024))
  if ((free < $2)); then
    echo "check-disk: $3 need about $2 MiB more on the filesystem of $1, which has $free MiB free." >&2
    echo "check-disk: free some space there (old clones and their build folders are the usual cause)," >&2
    echo "check-disk: or set SPACE_SKIP_DISK_CHECK=1 to build anyway." >&2
    exit 1
  fi
}
if [[ $(stat -c %d "$clone_dir") == $(stat -c %d "$cache_dir") ]]; then
  check "$clone_dir" $((clone_need + cache_need)) "the builds in the clone and the caches in $cache_dir"
else
  check "$clone_dir" "$clone_need" "the builds in the clone"
  check "$cache_dir" "$cache_need" "the caches in $cache_dir"
fi
