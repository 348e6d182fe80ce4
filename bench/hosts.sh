#!/usr/bin/env bash
# Compares two rdmablk host binaries (e.g. before and after a change) with
# `rdmablk bench` over NVMe/TCP on loopback against one rdmablk-target, as
# users would measure it: the target pinned to core 0 with one poller, the
# host pinned to core 1, rounds interleaved between the two, medians of IOPS
# and of the host's CPU time per I/O (bench's cpu_us_per_io: the process's
# user + system time over its I/Os, steadier than IOPS on a shared machine).
#
#   bench/hosts.sh OLD_RDMABLK NEW_RDMABLK [ROUNDS] [SECONDS]   (default 5 rounds of 5 s)
#
# Loads: 4 KiB random read and write at QD 32 on a 512 MiB memory namespace
# (LOADS="randread 4k 32,read 128k 8" picks others). BUSY_TARGET=1 runs the
# target with busy_poll (no wakeups for the host to pay for on loopback).
# Prints one line per load with the ratios new/old.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
old=${1:?usage: $0 OLD_RDMABLK NEW_RDMABLK [ROUNDS] [SECONDS]}
new=${2:?usage: $0 OLD_RDMABLK NEW_RDMABLK [ROUNDS] [SECONDS]}
rounds=${3:-5}
secs=${4:-5}
busy=false; [ -n "${BUSY_TARGET:-}" ] && busy=true
target=build/release/rdmablk-target
[ -x "$target" ] || cargo build --release --quiet -p rdmablk-target
nqn=nqn.2026-11.io.rdmablk:hosts

# One measurement: prints "IOPS CPU_US_PER_IO".
measure() { # host rw bs qd
  local port
  port=$(free_port)
  printf '[pollers]\ncount = 1\nbusy_poll = %s\n\n[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:%s"\n\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n\n[[subsystem.namespace]]\nbackend = "memory"\nsize = "512MiB"\n' \
    "$busy" "$port" "$nqn" > "$work/target.toml"
  taskset -c 0 "$target" --config "$work/target.toml" 2> "$work/target.log" &
  tpid=$!
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  if ! taskset -c 1 "$1" bench -t tcp -a 127.0.0.1 -s "$port" -n $nqn \
    --rw "$2" --bs "$3" --qd "$4" --runtime "${secs}s" --json > "$work/bench.json" 2> "$work/bench.err"; then
    echo "$1 bench failed:" >&2; tail -3 "$work/bench.err" >&2; tail -3 "$work/target.log" >&2; exit 1
  fi
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["iops"], r["cpu_us_per_io"])' "$work/bench.json"
  kill "$tpid"; wait "$tpid" 2>/dev/null || true; tpid=""
}

compare_loads "$old" "$new" "$rounds" "${LOADS:-randread 4k 32,randwrite 4k 32}"
