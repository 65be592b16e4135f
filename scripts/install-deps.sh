#!/usr/bin/env bash
# Installs the Debian packages SPACE needs to build, test and run, if any is missing.
# Idempotent and quiet when everything is there (no apt-get update then).
set -euo pipefail

packages=(
  # build
  cmake ninja-build g++ pkg-config make
  libgtest-dev libgmock-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libssl-dev
  libboost1.81-dev libsqlite3-dev
  # guest images: kernel build, debootstrap, ext4 images
  linux-source-6.1 bc flex bison libelf-dev xz-utils debootstrap e2fsprogs
  # virtual machines
  qemu-system-x86 qemu-utils
  # tests and benchmarks
  python3 jq
  # storage tests: a data dir on a loop-mounted btrfs
  btrfs-progs util-linux
)

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if ((EUID != 0)); then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
