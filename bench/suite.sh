#!/usr/bin/env bash
# The benchmark suite: the paths users have to a namespace, measured in one
# run with cores pinned (servers on core 0, clients on core 1: our NBD export
# and ublk daemon serve fio, so they run beside the target, where qemu-nbd and
# nbdkit run) and rounds interleaved between paths, written as JSON and
# drawn as SVG charts (IOPS and latency against queue depth) by
# rdmablk-chart. Not part of CI.
#
#   bench/suite.sh [--full] [OUT_DIR]     (default bench/results/suite-DATE)
#
# Paths: rdmablk bench -> rdmablk-target over NVMe/TCP, both with their
# defaults (adaptive polling), and rdmablk bench --busy-poll (the polling
# reference, as spdk_nvme_perf) against the same target; fio's nbd engine ->
# rdmablk connect --nbd -> rdmablk-target; fio's nbd engine -> qemu-nbd (raw
# file on tmpfs, io_uring) and -> nbdkit memory as local references; fio on
# /dev/ublkbN from rdmablk connect --ublk where the kernel has ublk.
# Quick matrix (default, about 20 minutes): randread and randwrite, 4k and
# 128k, QD 1, 4, 16, 32 and 64, 3 rounds of 3 s. --full: randread,
# randwrite, randrw; 4k, 16k, 128k, 1m; QD 1, 4, 16, 32, 64, 128; 3 rounds
# of 10 s.
# SUITE_ROUNDS and SUITE_SECS override the rounds and seconds (a smoke run),
# SUITE_RWS, SUITE_BSS and SUITE_QDS the patterns, block sizes and depths.
# Latency is of reads, of writes for randwrite.
set -euo pipefail
cd "$(dirname "$0")/.."
full=false
[ "${1:-}" = --full ] && { full=true; shift; }
out=${1:-bench/results/suite-$(date +%Y%m%d-%H%M%S)}
if $full; then
  rws="randread randwrite randrw"; bss="4k 16k 128k 1m"; qds="1 4 16 32 64 128"; rounds=3; secs=10
else
  rws="randread randwrite"; bss="4k 128k"; qds="1 4 16 32 64"; rounds=3; secs=3
fi
rounds=${SUITE_ROUNDS:-$rounds}; secs=${SUITE_SECS:-$secs}
rws=${SUITE_RWS:-$rws}; bss=${SUITE_BSS:-$bss}; qds=${SUITE_QDS:-$qds}
size=512M
bin=build/release
work=$(mktemp -d /tmp/rdmablk-suite.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work" /dev/shm/rdmablk-suite.raw
}
trap cleanup EXIT
bash scripts/setup.sh --test
cargo build --release --quiet
mkdir -p "$out"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=nqn.2026-11.io.rdmablk:suite
taskset -c 0 $bin/rdmablk-target --listen tcp://127.0.0.1:$port --memory $size --nqn $nqn --pollers 1 \
  2> "$work/target.log" & pids+=($!)
for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
taskset -c 0 $bin/rdmablk connect -t tcp -a 127.0.0.1 -s $port -n $nqn -Q 256 --nbd unix:$work/rdmablk.sock \
  > "$work/connect.out" 2> "$work/connect.log" & pids+=($!)
taskset -c 0 nbdkit -U "$work/nbdkit.sock" --exit-with-parent memory $size & pids+=($!)
truncate -s $size /dev/shm/rdmablk-suite.raw
taskset -c 0 qemu-nbd -f raw --cache=none --aio=io_uring --persistent --shared=8 -k "$work/qemu.sock" \
  /dev/shm/rdmablk-suite.raw & pids+=($!)
for s in rdmablk nbdkit qemu; do
  for _ in $(seq 100); do [ -S "$work/$s.sock" ] && break; sleep 0.1; done
  [ -S "$work/$s.sock" ] || { echo "no socket for $s" >&2; exit 1; }
done
paths="bench busy rdmablk qemu nbdkit"
ublk_dev=""
if [ -e /dev/ublk-control ]; then
  taskset -c 0 $bin/rdmablk connect -t tcp -a 127.0.0.1 -s $port -n $nqn --ublk --ublk-id 7 \
    > "$work/ublk.out" 2> "$work/ublk.log" & pids+=($!)
  for _ in $(seq 100); do grep -q '^ready: ' "$work/ublk.out" && break; sleep 0.1; done
  ublk_dev=$(sed -n 's/^ready: //p' "$work/ublk.out")
  [ -b "$ublk_dev" ] && paths="$paths ublk"
fi

label() {
  case $1 in
    bench) echo "rdmablk bench -> rdmablk-target" ;;
    busy) echo "rdmablk bench --busy-poll" ;;
    rdmablk) echo "fio nbd -> rdmablk export" ;;
    qemu) echo "fio nbd -> qemu-nbd (tmpfs)" ;;
    nbdkit) echo "fio nbd -> nbdkit memory" ;;
    ublk) echo "fio -> rdmablk ublk" ;;
  esac
}

# One measurement as a JSON object: path rw bs qd round.
measure() {
  local path=$1 rw=$2 bs=$3 qd=$4 round=$5 name
  name=$(label "$path")
  if [ "$path" = bench ] || [ "$path" = busy ]; then
    local poll=""
    [ "$path" = busy ] && poll=--busy-poll
    taskset -c 1 $bin/rdmablk bench -t tcp -a 127.0.0.1 -s $port -n $nqn --rw "$rw" --bs "$bs" --qd "$qd" \
      --runtime ${secs}s --json $poll 2>/dev/null |
      python3 -c '
import json, sys
j = json.load(sys.stdin); d = j["write"] if sys.argv[2] == "randwrite" else j["read"]
print(json.dumps({"path": sys.argv[1], "rw": sys.argv[2], "bs": sys.argv[3], "qd": int(sys.argv[4]), "round": int(sys.argv[5]),
  "iops": j["iops"], "bw_bytes": j["bw_bytes"], "p50_us": d["lat_us"]["p50"], "p99_us": d["lat_us"]["p99"],
  "p999_us": d["lat_us"]["p99.9"], "cpu_us_per_io": j["cpu_us_per_io"]}))' "$name" "$rw" "$bs" "$qd" "$round"
    return
  fi
  local target
  if [ "$path" = ublk ]; then
    target=(--ioengine=libaio --direct=1 --filename="$ublk_dev")
  else
    target=(--ioengine=nbd --uri="nbd+unix:///?socket=$work/$path.sock")
  fi
  taskset -c 1 fio --name=suite "${target[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" --size=$size \
      --runtime="$secs" --time_based --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
t = sys.stdin.read(); job = json.loads(t[t.index("{"):])["jobs"][0]
r, w = job["read"], job["write"]
lat = (w if sys.argv[2] == "randwrite" else r)["clat_ns"].get("percentile", {})
print(json.dumps({"path": sys.argv[1], "rw": sys.argv[2], "bs": sys.argv[3], "qd": int(sys.argv[4]), "round": int(sys.argv[5]),
  "iops": r["iops"] + w["iops"], "bw_bytes": r["bw_bytes"] + w["bw_bytes"],
  "p50_us": lat.get("50.000000", 0) / 1e3, "p99_us": lat.get("99.000000", 0) / 1e3,
  "p999_us": lat.get("99.900000", 0) / 1e3, "cpu_us_per_io": None}))' "$name" "$rw" "$bs" "$qd" "$round"
}

# Fill every device once so that reads hit written data everywhere.
for s in rdmablk nbdkit qemu; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$work/$s.sock" --rw=write --bs=1m --iodepth=8 \
    --size=$size >/dev/null 2>&1
done

results="$out/results.jsonl"
: > "$results"
n=0
for rw in $rws; do for bs in $bss; do for qd in $qds; do
  for round in $(seq $rounds); do
    for path in $paths; do
      measure "$path" "$rw" "$bs" "$qd" "$round" >> "$results"
      n=$((n + 1))
      printf '\r%d measurements' "$n" >&2
    done
  done
done; done; done
echo >&2
python3 -c 'import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))' \
  "$results" > "$out/results.json"
$bin/rdmablk-chart "$out/results.json" "$out"
python3 - "$out/results.json" <<'EOF'
import json, statistics, sys
runs = json.load(open(sys.argv[1]))
keys = sorted({(r["rw"], r["bs"], r["qd"]) for r in runs}, key=lambda k: (k[0], k[1], k[2]))
paths = list(dict.fromkeys(r["path"] for r in runs))
print(f"{'load':<22}" + "".join(f"{p[:26]:>28}" for p in paths))
for k in keys:
    row = f"{k[0]+' '+k[1]+' QD'+str(k[2]):<22}"
    for p in paths:
        v = [r["iops"] for r in runs if (r["rw"], r["bs"], r["qd"]) == k and r["path"] == p]
        row += f"{statistics.median(v):>28,.0f}" if v else f"{'-':>28}"
    print(row)
print("(median IOPS over the rounds; charts and JSON in " + sys.argv[1].rsplit("/", 1)[0] + ")")
EOF
