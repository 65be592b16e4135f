#!/usr/bin/env bash
# Installs the Debian packages SPACE needs to build, test and run, if any is missing.
# Idempotent and quiet when everything is there (no apt-get update then).
#   scripts/install-deps.sh          install what is missing
#   scripts/install-deps.sh --list   print the package list, one a line, and change nothing
# scripts/check-deps.py (run by `make test`) fails when the build or a script uses a file or
# program from a package that this list does not reach.
set -euo pipefail

packages=(
  # build
  cmake ninja-build g++ pkg-config make ccache
  libgtest-dev libgmock-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libssl-dev
  libboost1.81-dev libsqlite3-dev libnghttp2-dev zlib1g-dev
  # sandbox network: slots (netlink, nftables), the gateway's DNS parsing
  libnftables-dev libmnl-dev libldns-dev
  # the jail's own seccomp filter (space-jail is linked statically with it)
  libseccomp-dev
  # fuzzing: clang with libFuzzer and the sanitizer runtimes
  clang libclang-rt-14-dev
  # guest images: kernel build, debootstrap, ext4 images
  linux-source-6.1 bc flex bison libelf-dev xz-utils debootstrap e2fsprogs
  # virtual machines
  qemu-system-x86 qemu-utils
  # tests and benchmarks
  python3 jq curl
  # SPACE's QEMU (images/build-qemu.sh): the installed Debian QEMU's source package, fetched by
  # apt (checked with Debian's archive keys), unpacked with its patches and configured for the
  # microvm machine only
  dpkg-dev meson pkg-config libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev debian-archive-keyring
  # spacectl shell's test: a real terminal to type into and read from; script(1) for the
  # progress line spacectl draws only on one
  tmux bsdutils
  # network tests: the fake internet's namespaces, its servers' test CA
  iproute2 nftables openssl
  # storage tests: a data dir on a loop-mounted btrfs
  btrfs-progs util-linux mount
  # E2B SDK tests: the official e2b npm package runs on Node.js (>= 20.18.1; tests/e2b/run.sh
  # says so when an older one is installed) and comes from the npm registry with its npm
  nodejs diffutils
  # the web console's browser tests (tests/ui): Debian's Chromium, driven headless
  chromium
)

case ${1:-} in
  --list)
    printf '%s\n' "${packages[@]}"
    exit 0
    ;;
  '') ;;
  *)
    echo "usage: $0 [--list]" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
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
# A mirror that stops answering fails the step in minutes, not at CI's limit.
apt_net=(-o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30 -o Acquire::Retries=3)
timeout 300 apt-get "${apt_net[@]}" update -q
timeout 1200 apt-get "${apt_net[@]}" install -y -q --no-install-recommends "${missing[@]}"
