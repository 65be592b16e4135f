# Shared helpers for the image build scripts (sourced, not run).
# Contract: every artifact lives in $SPACE_IMAGE_CACHE/<kind>-<recipe-hash>/, is built in a
# temporary sibling directory and published with one rename, so a half-built image is never used.

set -euo pipefail

SPACE_IMAGE_CACHE=${SPACE_IMAGE_CACHE:-/var/cache/space/images}
SPACE_BUILD_JOBS=${SPACE_BUILD_JOBS:-$(($(nproc) + 1))}
_space_t0=$(date +%s)

elapsed() {
  local s=$(($(date +%s) - _space_t0))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# phase NAME MESSAGE: one progress line, prefixed with the artifact and the elapsed time.
phase() {
  printf '[images] %-8s %7s  %s\n' "$1" "$(elapsed)" "$2" >&2
}

die() {
  printf '[images] error: %s\n' "$*" >&2
  exit 1
}

# run_step ARTIFACT STEP LOG CMD...: runs CMD with its output appended to LOG. While it runs, a
# heartbeat shows it is alive; on failure the step and the log are named and the log's tail shown.
run_step() {
  local artifact=$1 step=$2 log=$3
  shift 3
  phase "$artifact" "$step"
  printf '\n===== %s: %s\n' "$step" "$*" >>"$log"
  "$@" >>"$log" 2>&1 &
  local pid=$! ticks=0 rc=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if ((ticks % 30 == 0)); then phase "$artifact" "  ... still: $step"; fi
  done
  wait "$pid" || rc=$?
  if ((rc != 0)); then
    printf '[images] step "%s" of %s failed (exit %d); last lines of %s:\n' "$step" "$artifact" "$rc" "$log" >&2
    tail -n 25 "$log" | sed 's/^/    /' >&2
    die "$artifact: step \"$step\" failed, full log: $log"
  fi
}

# recipe_hash FILE...: a short content hash over the given files and any extra strings on stdin.
# Only what defines an artifact goes in (not this helper file: progress output changes nothing).
recipe_hash() {
  { for f in "$@"; do printf '%s\n' "$(basename "$f")"; cat "$f"; done; cat; } | sha256sum | cut -c1-16
}

# make_workdir KIND: a temp dir next to the cache entries (same filesystem, so the rename is atomic).
make_workdir() {
  mkdir -p "$SPACE_IMAGE_CACHE"
  mktemp -d "$SPACE_IMAGE_CACHE/.tmp-$1-XXXXXX"
}

# publish WORKDIR DEST: fsync the finished artifact and rename it into place.
# Then keeps only the newest few entries of that kind, so every agent rebuild does not leave
# another image behind.
publish() {
  sync -f "$1" 2>/dev/null || sync
  rm -rf "$2"
  mv -T "$1" "$2"
  sync -f "$SPACE_IMAGE_CACHE" 2>/dev/null || true
  local kind
  kind=$(basename "$2")
  kind=${kind%-*}
  case $kind in
    rootfs) prune_kind rootfs 4 ;;
    *) prune_kind "$kind" 2 ;;
  esac
}

# lock_kind KIND [KIND...]: one build of a kind at a time (a second `make` waits for the first, then finds
# its result cached). Under the lock, any temp dir of that kind is left over from a killed build.
lock_kind() {
  mkdir -p "$SPACE_IMAGE_CACHE"
  exec 9>"$SPACE_IMAGE_CACHE/.lock-$1"
  if ! flock -n 9; then
    phase "$1" "waiting for another build of $1 to finish"
    flock 9
  fi
  local kind
  for kind in "$@"; do
    find "$SPACE_IMAGE_CACHE" -maxdepth 1 -name ".tmp-$kind-*" -exec rm -rf --one-file-system {} + 2>/dev/null || true
  done
}

# pinned_by ENTRY: prints the data dir of spaced whose pin on ENTRY keeps it (saved sandboxes
# there stand on it: vmm/image_bases.h). A pin keeps its entry while its data dir is a data dir
# of the pin's writer (its spaced.lock is theirs), and also while that cannot be known (the
# directory above it is missing: a file system not mounted now, another mount namespace). A pin
# whose data dir is plainly gone (its parent is there, it is not) or is not a data dir is removed.
pinned_by() {
  local pin target owner
  for pin in "$1"/pins/*; do
    [[ -f $pin ]] || continue
    target=$(head -n 1 "$pin")
    owner=$(stat -c %u "$pin")
    if [[ -n $target && -f $target/spaced.lock && $(stat -c %u "$target/spaced.lock") == "$owner" ]]; then
      echo "$target"
      return 0
    fi
    if [[ -n $target && $target == /* && ! -d ${target%/*} ]]; then
      echo "$target (not reachable now)"
      return 0
    fi
    rm -f "$pin"
  done
  return 1
}

# prune_kind KIND KEEP: keeps the KEEP most recently published or used (mtime) KIND-<hash>
# entries and removes the rest. Runs under the kind's lock. A VM still running from a removed
# image keeps its open file; new VMs use the current links. An entry a running spaced resolved
# at its start (it holds a shared flock on the entry's manifest.json for its life) is kept:
# spaced starts every VM from those paths, and would fail them all until restarted. So is an
# entry that a data dir's saved sandboxes stand on (a pin names it), whether spaced runs or not.
# The checks and the move out of the way happen under the manifest's exclusive flock: a spaced
# starting meanwhile waits for it, then finds the entry gone rather than half removed.
prune_kind() {
  local kind=$1 keep=$2 old by fd aside
  old=$(find "$SPACE_IMAGE_CACHE" -maxdepth 1 -type d -name "$kind-*" -printf '%T@ %p\n' | sort -rn | tail -n +$((keep + 1)) | cut -d' ' -f2-)
  [[ -z $old ]] && return 0
  while IFS= read -r dir; do
    fd=
    if [[ -f $dir/manifest.json ]]; then
      exec {fd}<"$dir/manifest.json"
      if ! flock -n -x "$fd"; then
        exec {fd}<&-
        phase "$kind" "keeping old $(basename "$dir"): a running spaced uses it"
        continue
      fi
    fi
    if by=$(pinned_by "$dir"); then
      [[ -n $fd ]] && exec {fd}<&-
      phase "$kind" "keeping old $(basename "$dir"): saved sandboxes of $by stand on it"
      continue
    fi
    phase "$kind" "pruning old $(basename "$dir")"
    aside="$SPACE_IMAGE_CACHE/.tmp-$kind-pruned-$(basename "$dir")"
    rm -rf --one-file-system "$aside"
    mv -T "$dir" "$aside"
    [[ -n $fd ]] && exec {fd}<&-
    rm -rf --one-file-system "$aside"
  done <<<"$old"
}

# host_mirror SUITE: the Debian mirror the host's own apt sources (deb822 or one-line format)
# name for SUITE (bookworm, bookworm-security), or nothing.
host_mirror() {
  local suite=$1 f uri
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    if [[ $f == *.sources ]]; then
      uri=$(awk -v s="$suite" '/^URIs:/{u=$2} /^Suites:/{ for (i=2;i<=NF;i++) if ($i == s && u != "") {print u; exit} }' "$f")
    else
      uri=$(awk -v s="$suite" '$1=="deb" { hit=0; for (i=2;i<=NF;i++) if ($i == s) hit=1;
        if (hit) for (i=2;i<=NF;i++) if ($i ~ /^(http|https|file):/) {print $i; exit} }' "$f")
    fi
    if [[ -n $uri ]]; then
      echo "$uri"
      return
    fi
  done
}

# remove_workdir DIR: never follows into a mount left inside a build tree (e.g. a bind of /dev).
remove_workdir() {
  rm -rf --one-file-system "$1"
}
