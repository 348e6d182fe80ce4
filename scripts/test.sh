#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, end-to-end tests with
# real processes on this machine, the RBD tests against a one-node Ceph
# cluster (scripts/ceph-dev.sh, started here and stopped afterwards), and the
# VM suite (the Linux kernel's NVMe-oF host and target, nbd, under QEMU).
# `--quick` runs only the tests on this machine: no formatting, lints, Ceph
# or VM.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

bash scripts/setup.sh --test
if [ $quick -eq 0 ]; then
  cargo fmt --all -- --check
  cargo clippy --release --all-targets -- -D warnings
fi
cargo build --release
cargo test --release --workspace
if [ $quick -eq 0 ]; then
  conf=$(bash scripts/ceph-dev.sh up | tail -n 1)
  trap 'bash scripts/ceph-dev.sh down' EXIT
  RDMABLK_CEPH_CONF=$conf cargo test --release -p rdmablk-tests --test e2e -- target::rbd:: \
    --ignored --test-threads=1
  bash scripts/ceph-dev.sh down
  trap - EXIT
  bash tests/vm/run.sh
fi
