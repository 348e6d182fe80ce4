#!/usr/bin/env bash
# The Ceph gateway's cost against librbd's own: `rbd bench` (librbd in its
# process, --rbd_cache=false like the RBD backend) and `rdmablk bench` over
# NVMe/TCP through rdmablk-target's RBD namespace, on the same image, in
# interleaved rounds; medians of IOPS and of CPU time per I/O (the rbd
# process's, librbd and messenger included; the target process's, librbd
# included, the host's not), and the ratios gateway/rbd.
#
#   bench/rbd.sh [ROUNDS]     (default 3; needs `cargo build --release`)
#   OLD=path/to/rdmablk-target bench/rbd.sh   # also an older gateway, same rounds
#   LOADS="randread 4k 32,read 128k 8,randwrite 4k 32" (the default)
#
# Runs against scripts/ceph-dev.sh's one-node cluster (started if needed,
# left running) or the cluster of $CEPH_CONF. The image (1 GiB) is written
# through before each turn: random writes fragment the test OSD's objects
# and halve later reads. Cores: the local cluster's daemons and the NVMe/TCP
# host on core 0 (HOST_CPUS, CLUSTER_CPUS), rbd bench and the gateway on core
# 1 (CLIENT_CPUS): the gateway and librbd's tool get the same core to
# themselves. Not part of CI.
#
# SPDK's RBD bdev (the data path of Ceph's NVMe-oF gateway) joins the
# rounds where SPDK is built with it (../shared/tools/spdk/build.sh with
# CONFIGURE_ARGS=--with-rbd, under $SPDK_SRC, default /tmp/spdk/spdk): its
# nvmf_tgt on the gateway's core, driven by the same host. Its reactor
# polls without sleeping, so its CPU per I/O is a whole core's time over
# its IOPS.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/cpu.sh
rounds=${1:-3}
conf=${CEPH_CONF:-$(bash scripts/ceph-dev.sh up | tail -n 1)}
client_cpus=${CLIENT_CPUS:-1}
host_cpus=${HOST_CPUS:-0}
if [ -z "${CEPH_CONF:-}" ]; then
  dir=$(dirname "$conf")
  for pidfile in "$dir/osd.0.pid" "$dir/mon.a.pid"; do
    taskset -a -p -c "${CLUSTER_CPUS:-0}" "$(cat "$pidfile")" >/dev/null
  done
fi
bin=build/release
new=$bin/rdmablk-target
old=${OLD:-}
spdk_src=${SPDK_SRC:-/tmp/spdk/spdk}
spdk=""
if [ -x "$spdk_src/build/bin/nvmf_tgt" ] && grep -Eq "^CONFIG_RBD[?]?=y" "$spdk_src/mk/config.mk" 2>/dev/null; then
  spdk=$spdk_src
fi
image=bench-$$
size_mib=1024
seconds=${SECONDS_PER_RUN:-8}
nqn=nqn.2026-11.io.example:rbd-bench
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

# The whole image written through, sequentially.
refill() {
  rbd -c "$conf" bench --rbd_cache=false --io-type write --io-pattern seq --io-size 4M \
    --io-threads 8 --io-total "${size_mib}M" "rbd/$image" >/dev/null 2>&1
}

# rbd_run TYPE PATTERN BS QD: "IOPS CPU_US_PER_IO" of rbd bench moving
# about $seconds' worth (its rate at the last run, or a first guess).
rbd_run() {
  local bs_bytes total
  bs_bytes=$(numfmt --from=iec "${3^^}")
  total=$(( $(cat "$work/rbd-rate-$1-$3" 2>/dev/null || echo 20000) * seconds * bs_bytes ))
  python3 - "$work/rbd-rate-$1-$3" "$bs_bytes" "$total" taskset -c "$client_cpus" \
    rbd -c "$conf" bench --rbd_cache=false --io-type "$1" --io-pattern "$2" --io-size "$bs_bytes" \
    --io-threads "$4" --io-total "$total" "rbd/$image" <<'EOF'
import os, re, subprocess, sys
rate_file, bs, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = subprocess.Popen(sys.argv[4:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
out = p.stdout.read()
_, status, ru = os.wait4(p.pid, 0)
m = re.search(r"elapsed:\s*([\d.]+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)", out)
if status != 0 or not m:
    sys.exit(f"rbd bench failed: {out[-500:]}")
ops, iops = int(m.group(2)), float(m.group(3))
open(rate_file, "w").write(str(int(iops)))
print(iops, (ru.ru_utime + ru.ru_stime) * 1e6 / ops)
EOF
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# drive PORT RW BS QD: "IOPS CPU_US_PER_IO" of rdmablk bench through the
# target process $tpid listening on PORT, the CPU time the target's; stops
# the target after.
drive() {
  local ticks0 ticks1 out
  ticks0=$(cpu_ticks $tpid)
  out=$(taskset -c "$host_cpus" "$bin/rdmablk" bench -t tcp -a 127.0.0.1 -s "$1" -n $nqn \
    --rw "$2" --bs "$3" --qd "$4" --runtime "${seconds}s" --json 2>/dev/null)
  ticks1=$(cpu_ticks $tpid)
  kill "$tpid"; wait "$tpid" 2>/dev/null || true; tpid=""
  iops_and_cpu_per_io "$out" "$ticks0" "$ticks1"
}

# gateway_run TARGET RW BS QD: drive TARGET (started here).
gateway_run() {
  local port
  port=$(free_port)
  taskset -c "$client_cpus" "$1" --listen "tcp://127.0.0.1:$port" --rbd "rbd/$image" \
    --ceph-conf "$conf" --nqn $nqn --pollers 1 >"$work/target.log" 2>&1 &
  tpid=$!
  for _ in $(seq 200); do
    grep -q "namespace active" "$work/target.log" && break
    sleep 0.05
  done
  grep -q "namespace active" "$work/target.log" || { cat "$work/target.log" >&2; exit 1; }
  drive "$port" "$2" "$3" "$4"
}

# spdk_run RW BS QD: drive SPDK's nvmf_tgt (started here on the gateway's
# core, its RBD bdev on the image).
spdk_run() {
  local port sock=$work/spdk.sock mem=(-s 1024 --no-huge)
  port=$(free_port)
  if [ "$(awk '/^HugePages_Free/{print $2}' /proc/meminfo)" -ge 512 ] && mount | grep -q hugetlbfs; then
    mem=(-s 1024)
  fi
  rm -f "$sock"
  CEPH_CONF=$conf "$spdk/build/bin/nvmf_tgt" -m "$(printf '0x%x' $((1 << client_cpus)))" \
    "${mem[@]}" --no-pci -r "$sock" >"$work/spdk.log" 2>&1 </dev/null &
  tpid=$!
  spdk_rpc() { /usr/bin/python3 "$spdk/scripts/rpc.py" -s "$sock" -t 30 "$@" >/dev/null; }
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  spdk_rpc framework_wait_init && spdk_rpc nvmf_create_transport -t TCP &&
    spdk_rpc bdev_rbd_create -b Rbd0 --user admin rbd "$image" 4096 &&
    spdk_rpc nvmf_create_subsystem "$nqn" -a -s SPDK00000000000001 &&
    spdk_rpc nvmf_subsystem_add_ns "$nqn" Rbd0 &&
    spdk_rpc nvmf_subsystem_add_listener "$nqn" -t tcp -f ipv4 -a 127.0.0.1 -s "$port" ||
    { tail -20 "$work/spdk.log" >&2; exit 1; }
  drive "$port" "$1" "$2" "$3"
}

# rbd bench's names for a load.
rbd_type() { case $1 in *write) echo write ;; *) echo read ;; esac; }
rbd_pattern() { case $1 in rand*) echo rand ;; *) echo seq ;; esac; }

echo "rounds: $rounds of ${seconds} s, image rbd/$image (${size_mib} MiB, refilled before each run)," \
  "cluster $conf; rbd bench and the gateway on core $client_cpus, the host on $host_cpus;" \
  "SPDK's RBD bdev: ${spdk:-not built (see the header)}" >&2
IFS=, read -ra loads <<< "${LOADS:-randread 4k 32,read 128k 8,randwrite 4k 32}"
for load in "${loads[@]}"; do
  set -- $load
  : > "$work/rbd"; : > "$work/new"; : > "$work/old"; : > "$work/spdk"
  for round in $(seq "$rounds"); do
    # Who goes first alternates between rounds.
    order="rbd new old spdk"
    [ $((round % 2)) -eq 0 ] && order="spdk old new rbd"
    for who in $order; do
      case $who in
        rbd) refill; rbd_run "$(rbd_type "$1")" "$(rbd_pattern "$1")" "$2" "$3" >> "$work/rbd" ;;
        new) refill; gateway_run "$new" "$1" "$2" "$3" >> "$work/new" ;;
        old) [ -n "$old" ] || continue; refill; gateway_run "$old" "$1" "$2" "$3" >> "$work/old" ;;
        spdk) [ -n "$spdk" ] || continue; refill; spdk_run "$1" "$2" "$3" >> "$work/spdk" ;;
      esac
    done
  done
  python3 - "$work" "$1 $2 QD$3" <<'EOF'
import os, statistics, sys
def med(name):
    p = os.path.join(sys.argv[1], name)
    rows = [tuple(map(float, l.split())) for l in open(p) if l.strip()]
    if not rows:
        return None
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
(ri, rc), (ni, nc), old, spdk = med("rbd"), med("new"), med("old"), med("spdk")
line = (f"{sys.argv[2]:>18}: rbd bench {ri:,.0f} IOPS {rc:.1f} us CPU/IO | gateway {ni:,.0f} IOPS "
        f"{nc:.1f} us CPU/IO | gateway/rbd IOPS {ni/ri:.2f}x, CPU/IO {nc/rc:.2f}x")
if old:
    oi, oc = old
    line += f" | old gateway {oi:,.0f} IOPS {oc:.1f} us CPU/IO (new/old IOPS {ni/oi:.2f}x)"
if spdk:
    si, sc = spdk
    line += f" | SPDK RBD bdev {si:,.0f} IOPS {sc:.1f} us CPU/IO (gateway/SPDK IOPS {ni/si:.2f}x)"
print(line)
EOF
done
