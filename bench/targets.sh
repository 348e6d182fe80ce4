#!/usr/bin/env bash
# Compares two rdmablk-target binaries (e.g. before and after a change) with
# `rdmablk bench` over NVMe/TCP on loopback, as users would measure it: the
# target pinned to core 0 with one poller, the bench pinned to core 1, rounds
# interleaved between the two, medians reported, and the target's CPU time
# per I/O (steadier than IOPS on a shared machine).
#
#   bench/targets.sh OLD_TARGET NEW_TARGET [ROUNDS] [SECONDS]   (default 5 rounds of 5 s)
#
# Loads: 4 KiB random read and write at QD 32, 128 KiB sequential read at QD 8, on a
# 512 MiB memory namespace (LOADS="read 128k 8,randwrite 4k 32" picks others).
# Prints one line per load with the ratio new/old.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
. bench/cpu.sh
old=${1:?usage: $0 OLD_TARGET NEW_TARGET [ROUNDS] [SECONDS]}
new=${2:?usage: $0 OLD_TARGET NEW_TARGET [ROUNDS] [SECONDS]}
rounds=${3:-5}
secs=${4:-5}
host=build/release/rdmablk
[ -x "$host" ] || cargo build --release --quiet -p rdmablk
nqn=nqn.2026-11.io.rdmablk:targets

# One measurement: prints "IOPS CPU_US_PER_IO".
measure() { # binary rw bs qd
  local port
  port=$(free_port)
  taskset -c 0 "$1" --listen tcp://127.0.0.1:$port --memory 512MiB --nqn $nqn --pollers 1 \
    2> "$work/target.log" &
  tpid=$!
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  local ticks0 ticks1 out
  ticks0=$(cpu_ticks $tpid)
  out=$(taskset -c 1 "$host" bench -t tcp -a 127.0.0.1 -s $port -n $nqn \
    --rw "$2" --bs "$3" --qd "$4" --runtime "${secs}s" --json 2>/dev/null)
  ticks1=$(cpu_ticks $tpid)
  kill "$tpid"; wait "$tpid" 2>/dev/null || true; tpid=""
  iops_and_cpu_per_io "$out" "$ticks0" "$ticks1"
}

compare_loads "$old" "$new" "$rounds" "${LOADS:-randread 4k 32,randwrite 4k 32,read 128k 8}"
