#!/usr/bin/env bash
# NVMe/TCP with TLS 1.3 against the same pair in plaintext, as users would
# measure it: rdmablk-target pinned to core 0 with one poller, `rdmablk
# bench` pinned to core 1, rounds interleaved between the two, medians of
# IOPS and of the host's CPU time per I/O. Records are sealed and opened in
# user space on both sides, unless the target's kernel has the tls module
# (the target then hands them to kernel TLS; RDMABLK_KTLS=0 keeps them in
# user space).
#
#   bench/tls.sh [ROUNDS] [SECONDS]   (default 5 rounds of 5 s)
#
# Loads: 4 KiB random read at QD 32 and 128 KiB read at QD 8 on a 512 MiB
# memory namespace (LOADS="randwrite 4k 32,..." picks others). Prints one
# line per load: "old" is plaintext, "new" is TLS, and the ratios TLS/plain.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
rounds=${1:-5}
secs=${2:-5}
target=build/release/rdmablk-target
host=build/release/rdmablk
[ -x "$target" ] && [ -x "$host" ] || cargo build --release --quiet
nqn=nqn.2026-12.io.rdmablk:tls-bench
hostnqn=nqn.2026-12.io.rdmablk:tls-bench-host
"$host" gen-tls-key > "$work/host.key"
chmod 600 "$work/host.key"

# One measurement: prints "IOPS CPU_US_PER_IO". $1: plain or tls.
measure() { # mode rw bs qd
  local port tls=()
  port=$(free_port)
  printf '[pollers]\ncount = 1\n\n[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:%s"\ntls = "optional"\n\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n[[subsystem.host]]\nnqn = "%s"\ntls_key_file = "%s"\n\n[[subsystem.namespace]]\nbackend = "memory"\nsize = "512MiB"\n' \
    "$port" "$nqn" "$hostnqn" "$work/host.key" > "$work/target.toml"
  chmod 600 "$work/target.toml"
  taskset -c 0 "$target" --config "$work/target.toml" 2> "$work/target.log" &
  tpid=$!
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  [ "$1" = tls ] && tls=(--tls-key-file "$work/host.key")
  if ! taskset -c 1 "$host" bench -t tcp -a 127.0.0.1 -s "$port" -n $nqn -q $hostnqn "${tls[@]}" \
    --rw "$2" --bs "$3" --qd "$4" --runtime "${secs}s" --json > "$work/bench.json" 2> "$work/bench.err"; then
    echo "$1 bench failed:" >&2; tail -3 "$work/bench.err" >&2; tail -3 "$work/target.log" >&2; exit 1
  fi
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["iops"], r["cpu_us_per_io"])' "$work/bench.json"
  kill "$tpid"; wait "$tpid" 2>/dev/null || true; tpid=""
}

echo "old: plaintext, new: TLS 1.3 ($(grep -qs '^tls ' /proc/modules && echo 'kernel TLS on the target' || echo 'user-space records'))"
compare_loads plain tls "$rounds" "${LOADS:-randread 4k 32,read 128k 8}"
