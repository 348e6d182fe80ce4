#!/usr/bin/env bash
# The partition suite's long run (the test suite runs 3 schedules): random
# fault schedules against a gateway group of three gateways on
# scripts/ceph-dev.sh's one-node cluster (started and stopped here), then
# against two gateways without a group (file namespace, no fencing), each
# with the history checker's verdict. Prints the schedules run, the faults
# by kind, the longest time without a completed operation after each kind,
# the operations checked and every anomaly with the schedule that showed it.
#
#   bench/partitions.sh [SCHEDULES] [FIRST_SEED] [ANA_SCHEDULES]
#     defaults: 50 schedules from seed 1000 on the gateway group (about 30 s
#     each), 10 on the two gateways. A failing schedule replays with
#     SCHEDULES=1 and its seed.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50}
first=${2:-1000}
ana=${3:-10}
bash scripts/setup.sh --test
cargo build --release --workspace --tests
addr=$(bash scripts/testnet.sh up)
conf=$(CEPH_DEV_ADDR="$addr" bash scripts/ceph-dev.sh up | tail -n 1)
trap 'bash scripts/ceph-dev.sh down' EXIT
log=$(mktemp /tmp/rdmablk-partitions.XXXXXX.log)
echo "full output: $log"
summary() { grep -E '^(partition suite|schedule |[0-9]+ schedules|longest|ops |anomaly|  \(showed|    client|test .* \.\.\. |faults that went wrong|gw-. (still ran|exited))' "$log" || true; }
rc=0
RUST_LOG=${RUST_LOG:-info} RDMABLK_CEPH_CONF="$conf" RDMABLK_PARTITION_SEED=$first \
  RDMABLK_PARTITION_SCHEDULES=$n cargo test --release --workspace --test e2e -- --ignored --exact \
  --nocapture target::rbd::partitions::every_acknowledged_write_survives_partitions_kills_and_freezes \
  >"$log" 2>&1 || rc=$?
summary
if [ "$ana" -gt 0 ]; then
  RUST_LOG=${RUST_LOG:-info} RDMABLK_PARTITION_SEED=$first RDMABLK_PARTITION_SCHEDULES=$ana \
    cargo test --release --workspace --test e2e -- --ignored --exact --nocapture \
    target::partitions::random_schedules_on_two_gateways_without_fencing >>"$log" 2>&1 || rc=$?
  summary | sed -n '/two gateways, no fencing/,$p'
fi
exit $rc
