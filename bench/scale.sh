#!/usr/bin/env bash
# rdmablk-target at scale, as a storage node behind a hypervisor farm sees
# it. Prints a table; nothing here passes or fails (the suite's reduced
# versions do: tests/tests/e2e/target/scale.rs).
#
#   bench/scale.sh hosts [HOSTS] [ROUNDS] [SECONDS]   (default 1000 hosts, 5 rounds of 5 s)
#   bench/scale.sh memory [NAMESPACES]                 (default 10000)
#   bench/scale.sh rbd [SUBSYSTEMS] [PER]              (default 16 x 256; scripts/ceph-dev.sh up)
#   bench/scale.sh failover [NAMESPACES]               (default 1024; the same cluster)
#   TARGET=path/to/rdmablk-target bench/scale.sh ...  (another build, e.g. before a change)
#
# hosts: two targets with one poller each, both pinned to core 0 (only one
# is busy at a time): one alone, one holding HOSTS idle hosts (distinct
# host NQNs, each an admin queue and one I/O queue, keep-alives only:
# hold_queues). `rdmablk bench` (core 1) runs 4 KiB random reads at QD 1
# and QD 32 against each, in interleaved rounds; the table has the medians
# and the ratio crowded/alone (what idle hosts cost a busy one), and the
# target's memory and descriptors per idle controller.
#
# memory: one target with NAMESPACES memory namespaces of 1 MiB, 1,000 per
# subsystem (a subsystem holds 1,024 at most): its start (to its port
# answering), resident memory, threads and descriptors; the discovery log,
# one `status` and one metrics scrape, timed, with their sizes; a reload
# that removes the first thousand namespaces and adds a thousand, timed;
# then verified I/O on a namespace the reload added.
#
# rbd: SUBSYSTEMS x PER RBD images of 64 MiB made on the test cluster (and
# removed after), one target exporting them all: the time from its start
# to every namespace active, its memory, threads and descriptors; a host
# (touch_namespaces) on every subsystem writes a block to every namespace
# and reads it back; one `status`, one metrics scrape, and the stop, timed.
#
# failover: a gateway group of three, each exporting the same NAMESPACES
# RBD images in two ANA groups (odd nsids in group 1, preferred gw-a;
# even in group 2, gw-b), reservations on; gw-a is killed (SIGKILL) and
# the time to every namespace of group 1 written and read back through
# the gateway that took it is printed (the host tries the two others in
# turn until one serves the whole group).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
mode=${1:-hosts}
target=${TARGET:-build/release/rdmablk-target}
host=build/release/rdmablk
hold=build/release/hold_queues
touch=build/release/touch_namespaces
[ -x "$target" ] && [ -x "$host" ] && [ -x "$hold" ] && [ -x "$touch" ] ||
  cargo build --release --quiet -p rdmablk-target -p rdmablk -p rdmablk-tests --bins
nqn=nqn.2026-11.io.rdmablk:scale
pids=()
cleanup_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; cleanup; }
trap cleanup_all EXIT

# start_target NAME: a one-poller target with a 256 MiB memory namespace on
# core 0; sets $port.
start_target() {
  port=$(free_port)
  printf '[pollers]\ncount = 1\n\n[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:%s"\n\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n\n[[subsystem.namespace]]\nbackend = "memory"\nsize = "256MiB"\n' \
    "$port" "$nqn" > "$work/$1.toml"
  taskset -c 0 "$target" --config "$work/$1.toml" 2> "$work/$1.log" &
  pids+=($!)
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && return; sleep 0.1; done
  echo "target $1 did not start:" >&2; tail -5 "$work/$1.log" >&2; exit 1
}

# status_of PID KEY: a field of /proc/PID/status (kB for memory).
status_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
fds_of() { ls "/proc/$1/fd" | wc -l; }

# bench_once PORT QD: prints "IOPS CPU_US_PER_IO" of the host.
bench_once() {
  taskset -c 1 "$host" bench -t tcp -a 127.0.0.1 -s "$1" -n "$nqn" \
    --rw randread --bs 4k --qd "$2" --runtime "${secs}s" --json > "$work/bench.json" 2> "$work/bench.err" ||
    { echo "bench failed:" >&2; tail -3 "$work/bench.err" >&2; exit 1; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["iops"], r["cpu_us_per_io"])' "$work/bench.json"
}

hosts() {
  local n=${1:-1000} rounds=${2:-5}
  secs=${3:-5}
  start_target alone; local alone=$port apid=${pids[-1]}
  start_target crowded; local crowded=$port cpid=${pids[-1]}
  local rss0 fd0
  rss0=$(status_of "$cpid" VmRSS); fd0=$(fds_of "$cpid")
  taskset -c 1 "$hold" "127.0.0.1:$crowded" "$nqn" --count "$n" --io-queues 1 --kato 30s \
    --hostnqn-prefix nqn.2026-11.io.rdmablk:idle > "$work/hold.out" 2> "$work/hold.err" &
  pids+=($!)
  local started=$SECONDS
  until grep -q '^holding' "$work/hold.out"; do
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then echo "hold_queues failed:" >&2; cat "$work/hold.err" >&2; exit 1; fi
    sleep 0.2
  done
  local took=$((SECONDS - started))
  sleep 1
  local rss1 fd1 threads
  rss1=$(status_of "$cpid" VmRSS); fd1=$(fds_of "$cpid"); threads=$(status_of "$cpid" Threads)
  echo "$n idle hosts connected in ${took}s: target +$(( (rss1 - rss0) / 1024 )) MiB resident" \
    "($(( (rss1 - rss0) * 1024 / n )) B per controller), +$((fd1 - fd0)) descriptors" \
    "($(python3 -c "print(f'{($fd1 - $fd0) / $n:.1f}')") per controller), $threads threads"
  for qd in 1 32; do
    : > "$work/alone"; : > "$work/crowded"
    for round in $(seq "$rounds"); do
      if [ $((round % 2)) -eq 1 ]; then
        bench_once "$alone" "$qd" >> "$work/alone"; bench_once "$crowded" "$qd" >> "$work/crowded"
      else
        bench_once "$crowded" "$qd" >> "$work/crowded"; bench_once "$alone" "$qd" >> "$work/alone"
      fi
    done
    python3 - "$work/alone" "$work/crowded" "$n" "$qd" <<'EOF'
import statistics, sys
def load(p):
    rows = [tuple(map(float, l.split())) for l in open(p) if l.strip()]
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
(ai, ac), (ci, cc) = load(sys.argv[1]), load(sys.argv[2])
print(f"randread 4k QD{sys.argv[4]:>2}: alone {ai:,.0f} IOPS | with {sys.argv[3]} idle hosts {ci:,.0f} IOPS"
      f" | crowded/alone {ci/ai:.2f}x (host CPU/IO {ac:.1f} vs {cc:.1f} us)")
EOF
  done
  kill "$apid" "$cpid" 2>/dev/null || true
}

# memory_config N FIRST PORT MPORT: N memory namespaces numbered from
# FIRST (namespace i is nsid i % 1000 + 1 of subsystem i / 1000).
memory_config() {
  python3 - "$@" <<'PY'
import sys
n, first, port, mport = map(int, sys.argv[1:])
print(f'[pollers]\ncount = 1\n\n[metrics]\nlisten = "127.0.0.1:{mport}"\n')
print(f'[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:{port}"\n')
by_sub = {}
for i in range(first, first + n):
    by_sub.setdefault(i // 1000, []).append(i % 1000 + 1)
for sub, nsids in sorted(by_sub.items()):
    print(f'[[subsystem]]\nnqn = "nqn.2026-11.io.rdmablk:scale-{sub}"\nallow_any_host = true\n')
    for nsid in nsids:
        print(f'  [[subsystem.namespace]]\n  nsid = {nsid}\n  backend = "memory"\n  size = "1MiB"\n')
PY
}

# timed COMMAND...: runs it with its output in $work/out; prints its wall
# time in ms.
timed() {
  local t0; t0=$(date +%s%N)
  "$@" > "$work/out" 2> "$work/err" || { echo "$* failed:" >&2; tail -3 "$work/err" >&2; exit 1; }
  echo $(( ($(date +%s%N) - t0) / 1000000 ))
}

memory() {
  local n=${1:-10000} port mport pid t0 started took
  port=$(free_port); mport=$(free_port)
  memory_config "$n" 0 "$port" "$mport" > "$work/mem.toml"
  t0=$(date +%s%N)
  taskset -c 0 "$target" --config "$work/mem.toml" --control "$work/control.sock" 2> "$work/mem.log" &
  pid=$!; pids+=("$pid")
  until (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "the target did not start:" >&2; tail -5 "$work/mem.log" >&2; exit 1; }
    sleep 0.02
  done
  started=$(( ($(date +%s%N) - t0) / 1000000 ))
  sleep 1
  echo "$n memory namespaces in $(( (n + 999) / 1000 )) subsystems: listening after ${started} ms;" \
    "$(( $(status_of "$pid" VmRSS) / 1024 )) MiB resident, $(status_of "$pid" Threads) threads, $(fds_of "$pid") descriptors"
  took=$(timed "$host" discover -t tcp -a 127.0.0.1 -s "$port")
  echo "discovery log: ${took} ms, $(grep -ci 'subnqn' "$work/out" || true) entries"
  took=$(timed "$target" status --control "$work/control.sock")
  echo "status: ${took} ms, $(wc -l < "$work/out") lines, $(wc -c < "$work/out") bytes"
  took=$(timed curl -sf "http://127.0.0.1:$mport/metrics")
  echo "metrics scrape: ${took} ms, $(grep -vc '^#' "$work/out") series, $(wc -c < "$work/out") bytes"
  memory_config "$n" 1000 "$port" "$mport" > "$work/mem.toml"
  took=$(timed "$target" reload --control "$work/control.sock")
  echo "reload removing 1000 namespaces and adding 1000: ${took} ms ($(tail -1 "$work/out"));" \
    "$(( $(status_of "$pid" VmRSS) / 1024 )) MiB resident after"
  local last=$(( n / 1000 )) nsid=$(( n % 1000 + 1 ))
  took=$(timed "$host" bench -t tcp -a 127.0.0.1 -s "$port" -n "nqn.2026-11.io.rdmablk:scale-$last" \
    --nsid "$nsid" --rw randrw --bs 4k --qd 8 --runtime 1s --verify --json)
  echo "I/O on nsid $nsid of scale-$last (added by the reload):" \
    "$(python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(f'{r[\"iops\"]:,.0f} IOPS, verified')" "$work/out")"
  kill "$pid" 2>/dev/null || true
}

# rbd_config SUBSYSTEMS PER PORT MPORT CONF: SUBSYSTEMS subsystems of PER
# RBD namespaces, namespace j of subsystem i on image scale-i-j.
rbd_config() {
  python3 - "$@" <<'PY'
import sys
subs, per, port, mport = map(int, sys.argv[1:5])
conf = sys.argv[5]
print(f'[metrics]\nlisten = "127.0.0.1:{mport}"\n')
print(f'[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:{port}"\n')
for i in range(subs):
    print(f'[[subsystem]]\nnqn = "nqn.2026-11.io.rdmablk:scale-{i}"\nallow_any_host = true\n')
    for j in range(per):
        print(f'  [[subsystem.namespace]]\n  nsid = {j + 1}\n  backend = "rbd"\n  pool = "rbd"\n'
              f'  image = "scale-{i}-{j}"\n  ceph_conf = "{conf}"\n  client_id = "rdmablk"\n')
PY
}

# rbd_images create|rm SUBSYSTEMS PER CONF: the bench's images, 16 at a time.
rbd_images() {
  local what=$1 subs=$2 per=$3 conf=$4
  for i in $(seq 0 $((subs - 1))); do for j in $(seq 0 $((per - 1))); do echo "rbd/scale-$i-$j"; done; done |
    case $what in
      create) xargs -P 16 -I{} rbd -c "$conf" create {} --size 64M --image-feature layering ;;
      rm) xargs -P 16 -I{} rbd -c "$conf" rm --no-progress {} 2> /dev/null || true ;;
    esac
}

rbd_scale() {
  local subs=${1:-16} per=${2:-256} conf=${RDMABLK_CEPH_CONF:-/tmp/rdmablk-ceph/ceph.conf}
  local n=$((subs * per)) port mport pid t0 took active=0
  [ -r "$conf" ] || { echo "no cluster: scripts/ceph-dev.sh up (or RDMABLK_CEPH_CONF)" >&2; exit 1; }
  t0=$(date +%s)
  rbd_images rm "$subs" "$per" "$conf"
  rbd_images create "$subs" "$per" "$conf"
  echo "$n images of 64 MiB created in $(( $(date +%s) - t0 )) s"
  trap 'rbd_images rm '"$subs $per $conf"'; cleanup_all' EXIT
  port=$(free_port); mport=$(free_port)
  rbd_config "$subs" "$per" "$port" "$mport" "$conf" > "$work/rbd.toml"
  t0=$(date +%s%N)
  taskset -c 0 "$target" --config "$work/rbd.toml" --control "$work/control.sock" 2> "$work/rbd.log" &
  pid=$!; pids+=("$pid")
  until [ "$active" -ge "$n" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "the target ended:" >&2; tail -5 "$work/rbd.log" >&2; exit 1; }
    [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 600 ] || { echo "only $active of $n active after 600 s" >&2; exit 1; }
    sleep 0.2
    active=$(grep -c 'namespace active' "$work/rbd.log" || true)
  done
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$n RBD namespaces in $subs subsystems: all active ${took} ms after the start;" \
    "$(( $(status_of "$pid" VmRSS) / 1024 )) MiB resident, $(status_of "$pid" Threads) threads, $(fds_of "$pid") descriptors"
  local nqns=()
  for i in $(seq 0 $((subs - 1))); do nqns+=("nqn.2026-11.io.rdmablk:scale-$i"); done
  took=$(timed "$touch" "127.0.0.1:$port" "${nqns[@]}")
  echo "a host on every subsystem: $(tail -1 "$work/out") (${took} ms with its start)"
  took=$(timed "$target" status --control "$work/control.sock")
  echo "status: ${took} ms, $(wc -l < "$work/out") lines"
  took=$(timed curl -sf "http://127.0.0.1:$mport/metrics")
  echo "metrics scrape: ${took} ms, $(grep -vc '^#' "$work/out") series, $(wc -c < "$work/out") bytes"
  t0=$(date +%s%N)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "stop (images closed): $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

# gateway_config GW PORT N CONF GROUP: gateway GW (a, b or c) of a group
# of three exporting images scale-0-0.. as N namespaces, the odd ones in
# ANA group 1 (preferred: gw-a), the even ones in group 2 (gw-b).
gateway_config() {
  python3 - "$@" <<'PY'
import sys
gw, port, n, conf, group = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
first = 1 + 1000 * "abc".index(gw)
print(f'[gateway_group]\nname = "{group}"\ngateway = "gw-{gw}"\npool = "rbd"\nceph_conf = "{conf}"\n'
      f'lease = "3s"\nfailback_delay = "600s"\npreferred = {{ 1 = "gw-a", 2 = "gw-b" }}\n')
print(f'[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:{port}"\n')
print(f'[[subsystem]]\nnqn = "nqn.2026-11.io.rdmablk:scale-0"\nallow_any_host = true\n'
      f'cntlid_min = {first}\ncntlid_max = {first + 999}\n')
for j in range(n):
    print(f'  [[subsystem.namespace]]\n  nsid = {j + 1}\n  backend = "rbd"\n  pool = "rbd"\n'
          f'  image = "scale-0-{j}"\n  ceph_conf = "{conf}"\n  ana_group = {1 if j % 2 == 0 else 2}\n')
PY
}

failover() {
  local n=${1:-1024} conf=${RDMABLK_CEPH_CONF:-/tmp/rdmablk-ceph/ceph.conf}
  local group="scale-$$" gw port t0 took active
  local -A ports pid
  [ -r "$conf" ] || { echo "no cluster: scripts/ceph-dev.sh up (or RDMABLK_CEPH_CONF)" >&2; exit 1; }
  t0=$(date +%s)
  rbd_images rm 1 "$n" "$conf"
  rbd_images create 1 "$n" "$conf"
  echo "$n images of 64 MiB created in $(( $(date +%s) - t0 )) s"
  trap 'rbd_images rm 1 '"$n $conf"'; cleanup_all' EXIT
  for gw in a b c; do
    ports[$gw]=$(free_port)
    gateway_config "$gw" "${ports[$gw]}" "$n" "$conf" "$group" > "$work/gw-$gw.toml"
    "$target" --config "$work/gw-$gw.toml" 2> "$work/gw-$gw.log" &
    pid[$gw]=$!; pids+=("${pid[$gw]}")
  done
  t0=$(date +%s%N)
  for gw in a b c; do
    active=0
    until [ "$active" -ge "$n" ]; do
      kill -0 "${pid[$gw]}" 2>/dev/null || { echo "gw-$gw ended:" >&2; tail -5 "$work/gw-$gw.log" >&2; exit 1; }
      sleep 0.2
      active=$(grep -c 'namespace active' "$work/gw-$gw.log" || true)
    done
  done
  echo "3 gateways, $n RBD namespaces each in 2 ANA groups, reservations on:" \
    "all active $(( ($(date +%s%N) - t0) / 1000000 )) ms after the start;" \
    "gw-a $(( $(status_of "${pid[a]}" VmRSS) / 1024 )) MiB resident, $(status_of "${pid[a]}" Threads) threads"
  local nqn=nqn.2026-11.io.rdmablk:scale-0
  until "$touch" "127.0.0.1:${ports[a]}" "$nqn" --ana-group 1 > "$work/out" 2> "$work/err"; do sleep 0.5; done
  echo "gw-a serves ANA group 1: $(tail -1 "$work/out")"
  t0=$(date +%s%N)
  kill -9 "${pid[a]}"
  local owner=""
  while [ -z "$owner" ]; do
    for gw in b c; do
      if "$touch" "127.0.0.1:${ports[$gw]}" "$nqn" --ana-group 1 > "$work/out" 2> "$work/err"; then
        owner=$gw; break
      fi
    done
    [ $(( ($(date +%s%N) - t0) / 1000000000 )) -lt 120 ] || { echo "no gateway served group 1 120 s after the kill" >&2; tail -3 "$work/err" >&2; exit 1; }
  done
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "SIGKILL of gw-a to every namespace of its group written and read back through gw-$owner:" \
    "${took} ms ($(tail -1 "$work/out"))"
}

case $mode in
  hosts) shift; hosts "$@" ;;
  memory) shift; memory "$@" ;;
  rbd) shift; rbd_scale "$@" ;;
  failover) shift; failover "$@" ;;
  *) echo "usage: $0 hosts [HOSTS] [ROUNDS] [SECONDS] | memory [NAMESPACES] | rbd [SUBSYSTEMS] [PER] | failover [NAMESPACES]" >&2; exit 2 ;;
esac
