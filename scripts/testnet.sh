#!/usr/bin/env bash
# The partition tests' network on this machine: a bridge, `rbktest0`, with
# 198.18.0.1/24 (RFC 2544's range for network tests, routed nowhere). The
# one-node Ceph cluster binds to that address (scripts/ceph-dev.sh with
# CEPH_DEV_ADDR=198.18.0.1) so that gateways and hosts in network namespaces
# of their own, each joined to the bridge by a veth pair (the tests make
# them: tests/src/testnet.rs), reach it; tests in this namespace still do.
#
# Usage: scripts/testnet.sh up|down
#   up    make the bridge (or leave it as it is) and print its address
#   down  remove it, and every network namespace the tests left (rbk-*)
# Run as root.
set -euo pipefail

BRIDGE=rbktest0
ADDR=198.18.0.1
PREFIX=24

die() {
  echo "testnet: error: $*" >&2
  exit 1
}
[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v ip >/dev/null || die "ip (iproute2) is not installed: run scripts/setup.sh --test"

case "${1:-}" in
  up)
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
      ip link add "$BRIDGE" type bridge
    fi
    if ! ip -4 addr show dev "$BRIDGE" | grep -q "inet $ADDR/$PREFIX"; then
      ip addr add "$ADDR/$PREFIX" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    echo "$ADDR"
    ;;
  down)
    for ns in $(ip netns list | awk '/^rbk-/ {print $1}'); do
      ip netns delete "$ns" || true
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
      ip link delete "$BRIDGE"
    fi
    ;;
  *)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
