#!/usr/bin/env bash
# Builds the base guest root filesystem, or reuses the cached one. Two cached stages:
#   os-<hash>/tree        Debian bookworm (debootstrap + packages.txt + users): slow, rarely changes
#   rootfs-<hash>/        rootfs.ext4 = the OS tree + SPACE's own guest files: seconds to redo
# Prints the rootfs artifact directory (holding rootfs.ext4 and manifest.json) on stdout.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

packages_file=$here/rootfs/packages.txt
mapfile -t packages < <(grep -Ev '^\s*(#|$)' "$packages_file")
suite=bookworm

# ---- stage 1: the OS tree
os_hash=$(printf '%s\n' "$suite" | recipe_hash "$packages_file" "$here/build-rootfs-os.sh")
os_dir=$SPACE_IMAGE_CACHE/os-$os_hash
mkdir -p "$SPACE_IMAGE_CACHE/logs"
lock_kind rootfs os
if [[ -d $os_dir/tree ]]; then
  touch "$os_dir"  # recently used: pruning keeps it
  phase os "cached: $os_dir"
else
  mirror=$(host_mirror "$suite")
  [[ -n $mirror ]] || die "no Debian $suite mirror found in the host's apt sources (/etc/apt/sources.list*)"
  work=$(make_workdir os)
  trap 'remove_workdir "$work"' EXIT
  log=$SPACE_IMAGE_CACHE/logs/os-$os_hash.log
  : >"$log"
  phase os "building os-$os_hash from $mirror (log: $log)"
  mkdir -p "$work/out"
  # debootstrap fetches one package at a time; it lays only the minimal base, apt (parallel
  # downloads, proper configure ordering) installs the package list inside the tree.
  mkdir -p "$SPACE_IMAGE_CACHE/debs"
  # Network steps are bounded: a mirror that stops answering fails the build in minutes.
  run_step os "debootstrap $suite minbase (~1 min)" "$log" bash -c \
    'timeout 900 debootstrap --variant=minbase --cache-dir="$1" "$2" "$3" "$4" || { cat "$3/debootstrap/debootstrap.log"; exit 1; }' \
    _ "$SPACE_IMAGE_CACHE/debs" "$suite" "$work/out/tree" "$mirror"
  run_step os "install ${#packages[@]} packages + dependencies, users, trim (~2 min)" "$log" \
    "$here/build-rootfs-os.sh" "$work/out/tree" "${packages[@]}"
  printf '{"format":1,"kind":"os","recipe_hash":"%s","suite":"%s"}\n' "$os_hash" "$suite" >"$work/out/manifest.json"
  publish "$work/out" "$os_dir"
  remove_workdir "$work"
  trap - EXIT
fi

# ---- stage 2: the bootable image = OS tree + SPACE guest files (the agent is PID 1)
agent_src=${SPACE_AGENT_BIN:-}
[[ -n $agent_src && -x $agent_src ]] || die "SPACE_AGENT_BIN must name the built space-agent (make build first)"
readelf -l "$agent_src" | grep -q INTERP && die "$agent_src is not statically linked"
# The image carries (and the hash covers) the stripped binary: debug info differs between
# checkouts even when the code does not.
agent_dir=$(mktemp -d)
trap 'rm -rf "$agent_dir"' EXIT
agent_bin=$agent_dir/space-agent
strip -o "$agent_bin" "$agent_src"
guest_files=("$agent_bin" "$here/rootfs/pip.conf")
hash=$(printf 'os %s\n' "$os_hash" | recipe_hash "${guest_files[@]}" "$0")
dest=$SPACE_IMAGE_CACHE/rootfs-$hash
if [[ -f $dest/rootfs.ext4 ]]; then
  touch "$dest"  # recently used: pruning keeps it
  phase rootfs "cached: $dest"
  echo "$dest"
  exit 0
fi
work=$(make_workdir rootfs)
trap 'remove_workdir "$work"; rm -rf "$agent_dir"' EXIT
log=$SPACE_IMAGE_CACHE/logs/rootfs-$hash.log
: >"$log"
phase rootfs "building rootfs-$hash (log: $log)"
# A hard-linked view of the cached tree costs no copy; files we add are new inodes, so the
# cached tree itself is never modified.
run_step rootfs "assemble tree" "$log" cp -al "$os_dir/tree" "$work/tree"
rm -f "$work/tree/sbin/space-agent"
install -m 0755 "$agent_bin" "$work/tree/sbin/space-agent"
# pip installs for the default user despite Debian's PEP 668 marker (why: the file's comment).
rm -f "$work/tree/etc/pip.conf"
install -m 0644 "$here/rootfs/pip.conf" "$work/tree/etc/pip.conf"
# ~/.local/bin exists from the start: Debian's ~/.profile puts it on PATH only if it exists when
# the login shell starts (exec runs `bash -l`), so a script pip installs there runs in the same
# command, and pip does not warn that it is off PATH. (cp -al made the directories anew: the
# cached tree is not changed.)
install -d -m 0755 -o 1000 -g 1000 "$work/tree/home/user/.local" "$work/tree/home/user/.local/bin"
used_mib=$(du -sm "$work/tree" | cut -f1)
size_mib=$((used_mib * 3 / 2 + 1024))
mkdir "$work/out"
run_step rootfs "mkfs.ext4 (${size_mib} MiB, ${used_mib} MiB used)" "$log" \
  mkfs.ext4 -q -F -d "$work/tree" -L space-root -E lazy_itable_init=0,lazy_journal_init=0 "$work/out/rootfs.ext4" "${size_mib}M"
printf '{"format":1,"kind":"rootfs","recipe_hash":"%s","os_hash":"%s","size_mib":%d,"init":"/sbin/space-agent"}\n' \
  "$hash" "$os_hash" "$size_mib" >"$work/out/manifest.json"
publish "$work/out" "$dest"
phase rootfs "done: $dest"
echo "$dest"
