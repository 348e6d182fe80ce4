#!/usr/bin/env bash
# Measures rdmablk against its peers in one run and prints ratios (this
# machine is shared and noisy: only numbers from the same run compare).
#
#   (a) rdmablk bench      -> rdmablk-target (memory namespace) over NVMe/TCP
#   (b) fio, nbd engine    -> rdmablk connect --nbd -> rdmablk-target
#   (c) fio, nbd engine    -> nbdkit memory, and qemu-nbd (raw file on tmpfs,
#                             --cache=none --aio=io_uring), same size
#
# Loads: 4 KiB random read at QD 32, 128 KiB sequential read at QD 32.
# Usage: bench/compare.sh [RUNTIME_SECONDS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
size=512M
bin=build/release
work=$(mktemp -d /tmp/rdmablk-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work" /dev/shm/rdmablk-bench.raw; }
trap cleanup EXIT
bash scripts/setup.sh --test
cargo build --release --quiet

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=nqn.2026-11.io.rdmablk:bench
$bin/rdmablk-target --listen tcp://127.0.0.1:$port --memory $size --nqn $nqn 2> "$work/target.log" & pids+=($!)
for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
$bin/rdmablk connect -t tcp -a 127.0.0.1 -s $port -n $nqn --nbd unix:$work/rdmablk.sock > "$work/connect.out" 2> "$work/connect.log" & pids+=($!)
nbdkit -U "$work/nbdkit.sock" --exit-with-parent memory $size & pids+=($!)
truncate -s $size /dev/shm/rdmablk-bench.raw
qemu-nbd -f raw --cache=none --aio=io_uring --persistent --shared=8 -k "$work/qemu.sock" /dev/shm/rdmablk-bench.raw & pids+=($!)
for s in rdmablk nbdkit qemu; do
  for _ in $(seq 100); do [ -S "$work/$s.sock" ] && break; sleep 0.1; done
  [ -S "$work/$s.sock" ] || { echo "no socket for $s" >&2; exit 1; }
done

fio_run() { # name uri rw bs -> prints "iops p50_us p99_us MiB/s"
  fio --name="$1" --ioengine=nbd --uri="$2" --rw="$3" --bs="$4" --iodepth=32 --size=$size \
      --runtime="$secs" --time_based --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["read"]; p=j["clat_ns"]["percentile"];
print("%.0f %.1f %.1f %.1f" % (j["iops"], p["50.000000"]/1e3, p["99.000000"]/1e3, j["bw_bytes"]/2**20))'
}
bench_run() { # rw bs -> same fields from rdmablk bench --json
  $bin/rdmablk bench -t tcp -a 127.0.0.1 -s $port -n $nqn --rw "$1" --bs "$2" --qd 32 --runtime ${secs}s --json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["read"];
print("%.0f %.1f %.1f %.1f" % (j["iops"], j["lat_us"]["p50"], j["lat_us"]["p99"], j["bw_bytes"]/2**20))'
}

# Fill every device once so that reads hit written data everywhere.
for s in rdmablk nbdkit qemu; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$work/$s.sock" --rw=write --bs=1m --iodepth=8 --size=$size >/dev/null 2>&1
done

declare -A r
for load in "randread 4k" "read 128k"; do
  set -- $load
  r[bench,$1]=$(bench_run "$1" "$2")
  for s in rdmablk nbdkit qemu; do r[$s,$1]=$(fio_run "$s" "nbd+unix:///?socket=$work/$s.sock" "$1" "$2"); done
done

printf '\n%-44s %10s %9s %9s %10s | %10s %10s\n' "path ($size, QD 32, ${secs}s each)" "4k IOPS" "p50 us" "p99 us" "128k MiB/s" "4k ratio" "128k ratio"
base4=$(echo ${r[nbdkit,randread]} | cut -d' ' -f1); base128=$(echo ${r[nbdkit,read]} | cut -d' ' -f4)
for row in "bench:rdmablk bench -> rdmablk-target (NVMe/TCP)" "rdmablk:fio nbd -> rdmablk connect -> target" "nbdkit:fio nbd -> nbdkit memory" "qemu:fio nbd -> qemu-nbd (tmpfs, io_uring)"; do
  k=${row%%:*}; label=${row#*:}
  read -r iops p50 p99 _ <<< "${r[$k,randread]}"
  read -r _ _ _ mib <<< "${r[$k,read]}"
  printf '%-44s %10s %9s %9s %10s | %10s %10s\n' "$label" "$iops" "$p50" "$p99" "$mib" \
    "$(python3 -c "print('%.2fx' % ($iops/$base4))")" "$(python3 -c "print('%.2fx' % ($mib/$base128))")"
done
echo "(ratios against nbdkit memory measured in this run)"
