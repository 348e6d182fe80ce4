#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, end-to-end tests with
# real processes on this machine, the Debian packages (tests/package/run.sh),
# the RBD tests against a one-node Ceph cluster (scripts/ceph-dev.sh, started
# here and stopped afterwards), and the VM suite (the Linux kernel's NVMe-oF
# host and target, nbd, under QEMU). `--quick` runs only the tests on this
# machine: no formatting, lints, packages, Ceph or VM. At its end (passed or
# not) it prints each phase's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

# Each phase's name and wall seconds, printed at exit.
phases=()
started=$(date +%s)
report() {
  local rc=$?
  echo
  echo "phase                          wall s"
  for p in "${phases[@]}"; do printf '%-30s %6s\n' "${p%%=*}" "${p#*=}"; done
  printf '%-30s %6s\n' total $(($(date +%s) - started))
  return $rc
}
trap report EXIT
# phase NAME COMMAND...: runs the command and records its wall time.
phase() {
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "$@" || rc=$?
  phases+=("$name=$(($(date +%s) - t0))")
  return $rc
}

phase setup bash scripts/setup.sh --test
if [ $quick -eq 0 ]; then
  phase fmt cargo fmt --all -- --check
  phase clippy cargo clippy --release --all-targets -- -D warnings
fi
phase build cargo build --release
phase "unit and e2e tests" cargo test --release --workspace
if [ $quick -eq 0 ]; then
  # The Debian packages: built, linted, installed and run under systemd in a
  # container, removed.
  phase "package" bash tests/package/run.sh
  t0=$(date +%s)
  # On the partition tests' bridge, so gateways in network namespaces reach
  # it (target::rbd::partitions); tests in this namespace reach it too.
  addr=$(bash scripts/testnet.sh up)
  conf=$(CEPH_DEV_ADDR="$addr" bash scripts/ceph-dev.sh up | tail -n 1)
  phases+=("ceph cluster up=$(($(date +%s) - t0))")
  trap 'bash scripts/ceph-dev.sh down; report' EXIT
  # --workspace as above: the same packages and features, so nothing is
  # compiled again.
  # fio through a gateway group under kills runs in bench/long.sh: the
  # partition suite (target::rbd::partitions) kills, freezes and cuts the
  # gateways here, with a checker of every operation.
  phase "RBD tests" env RDMABLK_CEPH_CONF="$conf" cargo test --release --workspace --test e2e \
    -- target::rbd:: --ignored --test-threads=1 \
    --skip target::rbd::gateway_fio::fio_over_every_path_rides_kills_a_freeze_and_failbacks
  bash scripts/ceph-dev.sh down
  trap report EXIT
  phase "VM suite" bash tests/vm/run.sh
fi
