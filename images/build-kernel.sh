#!/usr/bin/env bash
# Builds the guest kernel (uncompressed ELF vmlinux, booted through PVH) from Debian's
# linux-source-6.1 with tinyconfig + images/kernel/space.config, or reuses the cached one.
# Prints the artifact directory (holding vmlinux and config) on stdout.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

fragment=$here/kernel/space.config
source_tar=/usr/src/linux-source-6.1.tar.xz
[[ -f $source_tar ]] || die "missing $source_tar (apt-get install linux-source-6.1)"
src_version=$(dpkg-query -W -f='${Version}' linux-source-6.1)

hash=$(echo "linux-source-6.1 $src_version" | recipe_hash "$fragment" "$0")
dest=$SPACE_IMAGE_CACHE/kernel-$hash
cached() {
  [[ -f $dest/vmlinux ]] || return 1
  phase kernel "cached: $dest"
  echo "$dest"
}
cached && exit 0
lock_kind kernel
cached && exit 0
work=$(make_workdir kernel)
trap 'remove_workdir "$work"' EXIT
mkdir -p "$SPACE_IMAGE_CACHE/logs"
log=$SPACE_IMAGE_CACHE/logs/kernel-$hash.log
: >"$log"
phase kernel "building kernel-$hash (log: $log)"

run_step kernel "unpack linux-source $src_version" "$log" tar -xf "$source_tar" -C "$work"
tree=$work/linux-source-6.1
run_step kernel "configure (tinyconfig + space.config)" "$log" \
  bash -c "cd '$tree' && make tinyconfig && scripts/kconfig/merge_config.sh -m .config '$fragment' && make olddefconfig"

# Kconfig drops options whose dependencies are unmet without saying so; catch that here.
missing=()
while IFS= read -r line; do
  [[ $line =~ ^(CONFIG_[A-Z0-9_]+)=(.*)$ ]] || continue
  grep -qx "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}" "$tree/.config" || missing+=("${BASH_REMATCH[1]}")
done <"$fragment"
((${#missing[@]} == 0)) || die "kernel config lacks ${missing[*]} after merge (see $log)"

run_step kernel "compile vmlinux (-j$SPACE_BUILD_JOBS, ~4 min on 2 cores)" "$log" \
  make -C "$tree" -j"$SPACE_BUILD_JOBS" vmlinux
mkdir "$work/out"
cp "$tree/vmlinux" "$tree/.config" "$work/out/"
mv "$work/out/.config" "$work/out/config"
printf '{"format":1,"kind":"kernel","recipe_hash":"%s","source_version":"%s"}\n' "$hash" "$src_version" >"$work/out/manifest.json"
rm -rf "$tree"
publish "$work/out" "$dest"
phase kernel "done: $dest"
echo "$dest"
