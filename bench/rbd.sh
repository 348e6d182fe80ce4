#!/usr/bin/env bash
# rdmablk as a gateway to Ceph, against librbd's own tool on the same image:
# `rbd bench` (librbd in-process, --rbd_cache=false like the RBD backend)
# and `rdmablk bench` over NVMe/TCP through rdmablk-target's RBD namespace,
# in interleaved rounds, medians and the ratio rdmablk/rbd.
#
# Usage: bench/rbd.sh [ROUNDS]   (default 3; needs `cargo build --release`)
# Runs against scripts/ceph-dev.sh's one-node cluster (started if needed,
# left running) or the cluster of $CEPH_CONF. Loads: 4K random write QD32,
# 128K sequential read QD32. Not part of CI.
#
# Cores: the local cluster's daemons are pinned to core 0 and both clients
# (rbd bench; rdmablk-target with rdmablk bench) to core 1, as if the OSDs
# ran on machines of their own: the clients then compete for one core
# rather than taking CPU from the OSD. CLIENT_CPUS and CLUSTER_CPUS change it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
conf=${CEPH_CONF:-$(bash scripts/ceph-dev.sh up | tail -n 1)}
client_cpus=${CLIENT_CPUS:-1}
if [ -z "${CEPH_CONF:-}" ]; then
  dir=$(dirname "$conf")
  for pidfile in "$dir/osd.0.pid" "$dir/mon.a.pid"; do
    taskset -a -p -c "${CLUSTER_CPUS:-0}" "$(cat "$pidfile")" >/dev/null
  done
fi
bin=build/release
image=bench-$$
size_mib=512
seconds=5
work=$(mktemp -d /tmp/rdmablk-rbd-bench.XXXXXX)
tpid=""
cleanup() {
  [ -n "$tpid" ] && kill "$tpid" 2>/dev/null
  wait 2>/dev/null || true
  rbd -c "$conf" rm "rbd/$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

rbd -c "$conf" create "rbd/$image" --size "${size_mib}M" --image-feature layering
# Written once through, so that reads fetch data rather than holes.
rbd -c "$conf" bench --io-type write --io-pattern seq --io-size 4M --io-threads 8 \
  --io-total "${size_mib}M" "rbd/$image" >/dev/null 2>&1

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c "$client_cpus" "$bin/rdmablk-target" --listen "tcp://127.0.0.1:$port" --rbd "rbd/$image" \
  --ceph-conf "$conf" --nqn nqn.2026-11.io.example:rbd-bench >"$work/target.log" 2>&1 &
tpid=$!
for _ in $(seq 100); do
  grep -q "namespace active" "$work/target.log" && break
  sleep 0.1
done
grep -q "namespace active" "$work/target.log" || { cat "$work/target.log"; exit 1; }

# rbd_bench TYPE PATTERN BS TOTAL: ops per second of one run moving TOTAL
# (sizes as rbd takes them: 4K, 160M, 4G; sequential runs wrap around).
rbd_bench() {
  taskset -c "$client_cpus" rbd -c "$conf" bench --rbd_cache=false --io-type "$1" --io-pattern "$2" --io-size "$3" \
    --io-threads 32 --io-total "$4" "rbd/$image" 2>&1 |
    awk '/^elapsed:/ { for (i = 1; i < NF; i++) if ($i == "ops/sec:") print $(i + 1) }'
}

# ours RW BS: IOPS of `rdmablk bench` for $seconds.
ours() {
  taskset -c "$client_cpus" "$bin/rdmablk" bench -t tcp -a 127.0.0.1 -s "$port" -n nqn.2026-11.io.example:rbd-bench \
    --rw "$1" --bs "$2" --qd 32 --runtime "$seconds" --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["iops"])'
}

# compare NAME RBD_TYPE RBD_PATTERN RW BS RBD_TOTAL
compare() {
  : > "$work/rbd"; : > "$work/ours"
  for _ in $(seq "$rounds"); do
    rbd_bench "$2" "$3" "$5" "$6" >> "$work/rbd"
    ours "$4" "${5,,}" >> "$work/ours"
  done
  python3 - "$work/rbd" "$work/ours" "$1" <<'EOF'
import statistics, sys
r = statistics.median(float(l) for l in open(sys.argv[1]) if l.strip())
o = statistics.median(float(l) for l in open(sys.argv[2]) if l.strip())
print(f"{sys.argv[3]:>20}: rbd bench {r:,.0f} IOPS | rdmablk bench via rdmablk-target {o:,.0f} IOPS | ratio {o/r:.2f}x")
EOF
}

echo "rounds: $rounds, image rbd/$image (${size_mib} MiB), cluster $conf" >&2
# rbd bench moves a fixed total: about 5 s at this machine's rates.
compare "4K randwrite QD32" write rand randwrite 4K 160M
compare "128K read QD32" read seq read 128K 4G
