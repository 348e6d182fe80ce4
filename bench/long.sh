#!/usr/bin/env bash
# The suite's races and soaks at their long lengths, which the test suite
# runs short (scripts/test.sh): 8 hosts racing compare-and-write increments
# of one block (10,000 each rather than 1,000) on a file namespace and on an
# RBD image; three gateways at full load with no false failover for 10
# minutes (rather than 20 s); fio through a gateway group whose owner is
# killed ten times (rather than three). Pass/fail, as in the suite; the race
# prints its rate, the kills the median time to the new owner's first write. Runs against scripts/ceph-dev.sh's one-node cluster (started
# and stopped here).
#
#   bench/long.sh    (about 15 minutes)
#
# RDMABLK_CAW_INCREMENTS, RDMABLK_SOAK_SECS and RDMABLK_GATEWAY_KILLS
# override the lengths.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export RDMABLK_CAW_INCREMENTS=${RDMABLK_CAW_INCREMENTS:-10000}
export RDMABLK_SOAK_SECS=${RDMABLK_SOAK_SECS:-600}
export RDMABLK_GATEWAY_KILLS=${RDMABLK_GATEWAY_KILLS:-10}
cargo test --release --workspace --test e2e -- --exact --nocapture \
  target::compare_write::racing_compare_and_write_increments_lose_nothing
conf=$(bash scripts/ceph-dev.sh up | tail -n 1)
trap 'bash scripts/ceph-dev.sh down' EXIT
RDMABLK_CEPH_CONF="$conf" cargo test --release --workspace --test e2e -- --ignored --exact --nocapture \
  --test-threads=1 target::rbd::compare_write::compare_and_write_on_an_image_is_atomic \
  target::rbd::gateway_fio::no_false_failover_at_full_load \
  target::rbd::gateway_fio::fio_over_every_path_rides_kills_a_freeze_and_failbacks
