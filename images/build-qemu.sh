#!/usr/bin/env bash
# Builds SPACE's QEMU (qemu-system-x86_64 for the microvm machine and SPACE's virtio-mmio
# devices only: no modules, display, audio, USB host, PCI devices or tools) from the source of
# the Debian QEMU installed on this host, or reuses the cached one. Prints the artifact
# directory (holding qemu-system-x86_64, stripped, and manifest.json) on stdout.
#
# `make images` runs it; spaced and space-vm run the result (their --qemu default). Fewer
# devices means less a guest can reach, and it starts in half the time (bench/RESULTS.md,
# 2026-12-04).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

# The source: exactly the version of Debian's qemu-system-x86 installed here (its firmware is
# what this QEMU loads), fetched by apt, which checks it against the archive's signed indices.
# A security update of that package changes the version, hence the recipe hash: the next
# `make images` builds the update.
suite=bookworm
version=$(dpkg-query -W -f='${source:Version}' qemu-system-x86 2>/dev/null) ||
  die "Debian's qemu-system-x86 is not installed: run scripts/install-deps.sh"
[[ $version =~ ^[0-9A-Za-z.+:~-]+$ ]] || die "unexpected qemu-system-x86 source version: $version"
devices=$here/qemu/space.mak

# Its tools and libraries come with scripts/install-deps.sh (`make` runs it).
for p in dpkg-dev meson pkg-config libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev libseccomp-dev \
  debian-archive-keyring; do
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

# deb-src entries for the mirrors the host's apt uses, in a private apt state: the host's own
# sources and lists are left as they are.
mirror=$(host_mirror "$suite")
[[ -n $mirror ]] || die "no Debian $suite mirror found in the host's apt sources (/etc/apt/sources.list*)"
security=$(host_mirror "$suite-security")
apt_dir=$work/apt
mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/dl"
{
  printf 'Types: deb-src\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' "$mirror" "$suite" "$suite"
  printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  if [[ -n $security ]]; then
    printf '\nTypes: deb-src\nURIs: %s\nSuites: %s-security\nComponents: main\n' "$security" "$suite"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  fi
} >"$apt_dir/sources/debian-src.sources"
# Bounded: a mirror that stops answering fails the build in minutes, not hours. The host's
# apt.conf.d still applies (a proxy it needs, say), so what the check rests on is set here: a
# host that allows unsigned or weakly signed repositories does not allow them for this source.
apt_options=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt_dir/sources"
  -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root
  -o Acquire::AllowInsecureRepositories=false -o Acquire::AllowDowngradeToInsecureRepositories=false
  -o Acquire::AllowWeakRepositories=false -o APT::Get::AllowUnauthenticated=false
  -o Acquire::Check-Valid-Until=true
  -o Acquire::Languages=none -o Acquire::Retries=3 -o Acquire::http::Timeout=60 -o Acquire::https::Timeout=60)
run_step qemu "apt: the source indices of $mirror${security:+ and $security}" "$log" \
  timeout 900 apt-get "${apt_options[@]}" -q update
# A host that has not upgraded may hold a version its mirrors no longer carry: say what to do.
available=$(apt-cache "${apt_options[@]}" showsrc qemu 2>>"$log" | awk '/^Version:/ {print $2}' | sort -u | tr '\n' ' ')
if [[ " $available" != *" $version "* ]]; then
  die "the mirrors no longer carry the source of the qemu-system-x86 installed here ($version; they have:" \
    "${available:-none}); upgrade it (apt-get install --only-upgrade qemu-system-x86), then run make again"
fi
fetch_source() { cd "$work/dl" && timeout 900 apt-get "${apt_options[@]}" -q source --download-only "qemu=$version"; }
run_step qemu "apt: the source of qemu $version (checked against the signed indices)" "$log" fetch_source
dsc=$(find "$work/dl" -maxdepth 1 -name 'qemu_*.dsc' | head -n 1)
[[ -n $dsc ]] || die "apt fetched no qemu .dsc (see $log)"
run_step qemu "unpack and apply Debian's patches" "$log" dpkg-source --no-check -x "$dsc" "$work/src"
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
chmod 0755 "$work/out/qemu-system-x86_64"  # jailed QEMUs run it as their own uids
# It starts the microvm machine (its firmware found) and answers on QMP.
answer=$(printf '{"execute":"qmp_capabilities"}\n{"execute":"quit"}\n' |
  timeout 30 "$work/out/qemu-system-x86_64" -machine microvm -nodefaults -no-user-config -display none -S \
    -qmp stdio 2>&1) || die "the new QEMU does not start: $answer"
[[ $answer == *'"return"'* ]] || die "the new QEMU does not answer on QMP: $answer"
printf '{"format":1,"kind":"qemu","recipe_hash":"%s","source_version":"%s"}\n' "$hash" "$version" >"$work/out/manifest.json"
rm -rf "$work/src" "$work/build" "$work/dl" "$apt_dir"
publish "$work/out" "$dest"
phase qemu "done: $dest"
echo "$dest"
