#!/usr/bin/env bash
# Turns a freshly debootstrapped minimal tree into the SPACE base OS: installs the package list
# (arguments after the tree), creates the users, and drops package caches.
# Runs inside the os stage of build-rootfs.sh; the tree's kernel filesystems are always unmounted.
set -euo pipefail
tree=$1
shift
packages=("$@")

mounted=()
cleanup() {
  local m
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  rm -f "$tree/usr/sbin/policy-rc.d"
}
trap cleanup EXIT
mount -t proc proc "$tree/proc" && mounted+=("$tree/proc")
mount -t sysfs sysfs "$tree/sys" && mounted+=("$tree/sys")
mount --bind /dev "$tree/dev" && mounted+=("$tree/dev")
mount --bind /dev/pts "$tree/dev/pts" && mounted+=("$tree/dev/pts")

in_tree() {
  chroot "$tree" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"
}
# No service may start inside the build tree.
printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
chmod 0755 "$tree/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$tree/etc/resolv.conf" 2>/dev/null || true

# Network steps are bounded: a mirror that stops answering fails the build in minutes.
apt_net=(-o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30 -o Acquire::Retries=3)
in_tree timeout 300 apt-get "${apt_net[@]}" update -q
in_tree timeout 1200 apt-get "${apt_net[@]}" install -y -q --no-install-recommends "${packages[@]}"

in_tree useradd --create-home --shell /bin/bash --uid 1000 --user-group user
printf 'user ALL=(ALL:ALL) NOPASSWD:ALL\n' >"$tree/etc/sudoers.d/user"
chmod 0440 "$tree/etc/sudoers.d/user"
echo space >"$tree/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tspace\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$tree/etc/hosts"
: >"$tree/etc/fstab"
: >"$tree/etc/resolv.conf"

# Every promised tool must be there; a missing one fails the build, not a user's first command.
for tool in bash python3 python pip3 git curl wget sudo ps ip tput node npm; do
  in_tree sh -c "command -v $tool" >/dev/null || { echo "missing tool in image: $tool" >&2; exit 1; }
done

in_tree apt-get clean
rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/apt/*.bin "$tree"/var/log/*.log "$tree"/var/log/apt/*
