#!/usr/bin/env bash
# Builds a minimal QEMU (qemu-system-x86_64 for the microvm machine and SPACE's virtio-mmio
# devices only: no modules, display, audio, USB host, PCI devices or tools) from Debian 12's
# own QEMU source package, or reuses the cached one. Prints the artifact directory (holding
# qemu-system-x86_64, stripped, and manifest.json) on stdout.
#
# Not part of `make run`/`make test` yet: spaced runs Debian's QEMU. bench/qemu_minimal.sh
# builds this and measures the two side by side (bench/RESULTS.md, 2026-12-04).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

# The source: Debian's package, pinned, and checked against the .dsc's SHA-256 sums below. A
# newer security update replaces it in the pool; then pin the new version and its sums.
version=7.2+dfsg-7+deb12u18
pool=${SPACE_DEBIAN_POOL:-https://deb.debian.org/debian/pool/main/q/qemu}
declare -A sha256=(
  [qemu_7.2+dfsg.orig.tar.xz]=91aca71520040edc40b8d437aa3004dae614f58e286cf653ee8996c07af2962f
  [qemu_7.2+dfsg-7+deb12u18.debian.tar.xz]=28a1c86310ee53b6bf1854cffe6f6be6ed29a08db7d05759f8ac57b8d6a6cb2f
  [qemu_7.2+dfsg-7+deb12u18.dsc]=6b6bd27b947ec89e40a1d6b26d9c9f3c698ca691da13163e0483f6061bbb20b3
)
devices=$here/qemu/space.mak

# Its tools and libraries come with scripts/install-deps.sh (`make` runs it).
for p in dpkg-dev meson pkg-config libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev libseccomp-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    die "package $p is missing: run scripts/install-deps.sh"
done

hash=$(echo "qemu $version" | recipe_hash "$devices" "$0")
dest=$SPACE_IMAGE_CACHE/qemu-$hash
cached() {
  [[ -x $dest/qemu-system-x86_64 ]] || return 1
  phase qemu "cached: $dest"
  echo "$dest"
}
cached && exit 0
lock_kind qemu
cached && exit 0
work=$(make_workdir qemu)
trap 'remove_workdir "$work"' EXIT
mkdir -p "$SPACE_IMAGE_CACHE/logs"
log=$SPACE_IMAGE_CACHE/logs/qemu-$hash.log
: >"$log"
phase qemu "building qemu-$hash from Debian's qemu $version (log: $log)"

mkdir "$work/dl"
for f in "${!sha256[@]}"; do
  # HTTPS, and bounded before the check: a file announced over 64 MiB is refused (the largest
  # is 23 MiB), and no download runs over 10 minutes.
  run_step qemu "download $f" "$log" \
    curl -fsS --retry 3 --max-filesize 67108864 --max-time 600 -o "$work/dl/$f" "$pool/$f"
  echo "${sha256[$f]}  $work/dl/$f" | sha256sum -c --quiet - >>"$log" 2>&1 ||
    die "$f does not match its pinned SHA-256 (see $log)"
done
run_step qemu "unpack and apply Debian's patches" "$log" \
  dpkg-source --no-check -x "$work/dl/qemu_$version.dsc" "$work/src"
cp "$devices" "$work/src/configs/devices/x86_64-softmmu/space.mak"
# QEMU 7.2 links its x86 ACPI stubs into a build without the PC machines, next to the real
# functions microvm's ACPI tables use (fixed upstream in 8.0): the real ones must win.
sed -i -e 's/^void pc_madt_cpu_entry(/void __attribute__((weak)) pc_madt_cpu_entry(/' \
  -e 's/^Object \*acpi_get_i386_pci_host(void)/Object *__attribute__((weak)) acpi_get_i386_pci_host(void)/' \
  "$work/src/hw/acpi/acpi-x86-stub.c"
mkdir "$work/build"
# Firmware from Debian's packages (microvm's bios-microvm.bin is seabios's), as Debian's build.
# QEMU 7.2 looks for paths under its prefix next to the binary, wherever it is: the prefix is
# one the firmware paths are not under, so that they stay absolute (nothing is installed).
run_step qemu "configure (microvm + virtio-mmio only)" "$log" bash -c "cd '$work/build' && PATH=/usr/bin:\$PATH \
  ../src/configure --prefix=/opt/space-qemu --target-list=x86_64-softmmu --without-default-features \
  --without-default-devices --with-devices-x86_64=space --enable-tcg --enable-kvm --enable-seccomp \
  --enable-fdt=system --disable-docs --disable-tools --disable-guest-agent \
  --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu"
run_step qemu "compile qemu-system-x86_64 (-j$SPACE_BUILD_JOBS, ~7 min on 2 cores)" "$log" \
  ninja -C "$work/build" -j"$SPACE_BUILD_JOBS" qemu-system-x86_64
mkdir "$work/out"
strip -o "$work/out/qemu-system-x86_64" "$work/build/qemu-system-x86_64"
# It starts the microvm machine (its firmware found) and answers on QMP.
answer=$(printf '{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n' |
  timeout 30 "$work/out/qemu-system-x86_64" -machine microvm -nodefaults -no-user-config -display none -S \
    -qmp stdio 2>&1) || die "the new QEMU does not start: $answer"
[[ $answer == *'"return"'* ]] || die "the new QEMU does not answer on QMP: $answer"
printf '{"format":1,"kind":"qemu","recipe_hash":"%s","source_version":"%s"}\n' "$hash" "$version" >"$work/out/manifest.json"
rm -rf "$work/src" "$work/build" "$work/dl"
publish "$work/out" "$dest"
phase qemu "done: $dest"
echo "$dest"
