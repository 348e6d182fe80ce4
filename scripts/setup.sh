#!/usr/bin/env bash
# Installs the system packages rdmablk needs to build and test, idempotently.
# Debian 12 with only the Rust toolchain is enough to start from; run as root
# (or with sudo available).
set -euo pipefail

# Build: gcc and pkg-config for -sys crates; the RDMA verbs and CM libraries
# and libclang for rdma-sys (its bindings are generated at build time);
# OpenSSL for NVMe/TCP over TLS.
BUILD_PKGS=(gcc pkg-config libibverbs-dev librdmacm-dev libclang-dev libssl-dev)
# Tests with real clients we did not write, and the VM suite's QEMU.
# prometheus ships promtool, which lints the metrics endpoint's output.
# gnutls-bin ships gnutls-cli: GnuTLS (the library of the kernel's tlshd) as a TLS peer.
# The Ceph mon, OSD and CLI run scripts/ceph-dev.sh's cluster; librbd-dev to build against librbd.
# iproute2 and nftables make the partition tests' network (scripts/testnet.sh) and cut its links.
TEST_PKGS=(fio nbdkit libnbd-bin e2fsprogs fuse3 util-linux busybox-static cpio qemu-system-x86 gnutls-bin
  prometheus ceph-mon ceph-osd ceph-common librbd-dev iproute2 nftables)

# The Debian packages (scripts/deb.sh) and their checks: lintian, man-db
# (man -l), bash-completion, systemd-container (the packaged unit runs under
# systemd in a container: tests/package/run.sh).
PACKAGE_PKGS=(debhelper dpkg-dev lintian man-db bash-completion systemd systemd-container)

want=("${BUILD_PKGS[@]}")
case "${1:-}" in
  --test) want+=("${TEST_PKGS[@]}" "${PACKAGE_PKGS[@]}") ;;
  --package) want+=("${PACKAGE_PKGS[@]}") ;;
  "") ;;
  *) echo "usage: $0 [--test | --package]" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
pins=()
for p in "${missing[@]}"; do
  if [ "$p" = qemu-system-x86 ]; then
    # qemu-system-x86 needs qemu-utils of its own version (a newer one from
    # backports may be installed): install both at the same version.
    v=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/{print $2}')
    pins+=("qemu-system-x86=$v" "qemu-utils=$v")
  else
    pins+=("$p")
  fi
done
$SUDO apt-get install -y -qq --no-install-recommends --allow-downgrades "${pins[@]}" >/dev/null
