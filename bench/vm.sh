#!/usr/bin/env bash
# The VM's comparisons, measured: boots the VM suite's comparison scenarios
# (tests/vm/run.sh) with VM_MEASURE=1, so that their loads run long enough
# for figures (5-8 s each, rather than the suite's 1 s), and prints each
# load's ratio of its two sides, measured in the same boot:
#   40-compare-tcp    rdmablk-target / nvmet-tcp  (blkload on /dev/nvmeXnY)
#   42-compare-tls    the kernel host over TLS / in plaintext, against
#                     rdmablk-target with kernel TLS and with user-space records
#   70-compare-rdma   rdmablk-target / nvmet-rdma (fio on /dev/nvmeXnY, and
#                     rdmablk bench sleeping and busy polling; CPU per I/O)
#   85-compare-ublk   adaptive / sleeping polling through ublk, nbd and the
#                     kernel's NVMe/TCP host
# The VM runs under TCG: only ratios within one boot mean anything.
#
#   bench/vm.sh [SCENARIO...]    (default: the three above; about 6 minutes)
#
# The console log stays in build/vm-bench/console.log (VM_WORK overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(40-compare-tcp 42-compare-tls 70-compare-rdma 85-compare-ublk)
export VM_WORK=${VM_WORK:-build/vm-bench}
cargo build --release --quiet
VM_PARALLEL=1 VM_MEASURE=1 bash tests/vm/run.sh "${scenarios[@]}" > "$VM_WORK.out" 2>&1 ||
  { tail -40 "$VM_WORK.out"; echo "bench/vm.sh: the VM run failed (log: $VM_WORK.out)" >&2; exit 1; }
bench/vm-ratios.awk "$VM_WORK/console.log"
