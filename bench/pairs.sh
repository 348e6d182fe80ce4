#!/usr/bin/env bash
# Host and target polling modes against each other, as users would measure
# them: every host below against every target below over NVMe/TCP on
# loopback, the target pinned to core 0 with one poller, the host pinned to
# core 1, the hosts' order rotated and the targets' alternated between
# rounds, medians. Then the CPU an
# idle target and an idle connected host use.
#
#   bench/pairs.sh [ROUNDS] [SECONDS] [IDLE_SECONDS]   (default 3 rounds of 8 s; 30 s idle)
#
# Hosts: `rdmablk bench --busy-poll` (the polling reference: it matched
# spdk_nvme_perf against both SPDK's target and ours), `rdmablk bench` with
# its defaults, and, with OLD_BIN=DIR, the rdmablk in DIR with its defaults.
# Targets: rdmablk-target with its defaults, and with OLD_BIN the one in DIR.
# Binaries come from build/release (NEW_BIN=DIR picks others). Load: 4 KiB
# random read at QD 32 on a 512 MiB memory namespace (LOAD="RW BS QD").
# Prints, per pair, the median IOPS, the ratio to the reference host against
# the same target, the host's CPU time per I/O and the target's CPU use.
# With OLD_BIN, also the NBD path before and after: fio's nbd engine (core 1)
# -> rdmablk connect --nbd -> rdmablk-target (both on core 0, as in
# bench/suite.sh), old and new binaries in turn (NBD_LOADS="RW BS QD,...",
# default 4 KiB random reads at QD 1 and 32; NBD_LOADS= skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
rounds=${1:-3}
secs=${2:-8}
idle_secs=${3:-30}
new_bin=${NEW_BIN:-build/release}
old_bin=${OLD_BIN:-}
read -r rw bs qd <<< "${LOAD:-randread 4k 32}"
[ -x "$new_bin/rdmablk" ] || cargo build --release --quiet
nqn=nqn.2026-11.io.rdmablk:pairs

hosts=("busy-poll|$new_bin/rdmablk|--busy-poll" "default|$new_bin/rdmablk|")
targets=("default|$new_bin/rdmablk-target")
if [ -n "$old_bin" ]; then
  hosts+=("old default|$old_bin/rdmablk|")
  targets+=("old default|$old_bin/rdmablk-target")
fi

# CPU time (user + system) of a process so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# Starts target binary $1 on a free port (in $port), pinned to core 0.
start_target() {
  port=$(free_port)
  printf '[pollers]\ncount = 1\n\n[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:%s"\n\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n\n[[subsystem.namespace]]\nbackend = "memory"\nsize = "512MiB"\n' \
    "$port" "$nqn" > "$work/target.toml"
  taskset -c 0 "$1" --config "$work/target.toml" 2> "$work/target.log" &
  tpid=$!
  for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
}

stop_target() { kill "$tpid"; wait "$tpid" 2>/dev/null || true; tpid=""; }

# One run of host binary $2 (flags $3) against the running target; appends
# "target|host IOPS HOST_CPU_US_PER_IO TARGET_CPU_PERCENT" to the results.
measure() { # target_label host_label host_bin host_flags
  local t0 t1 start end
  t0=$(cpu_ticks "$tpid"); start=$(date +%s%N)
  # shellcheck disable=SC2086
  if ! taskset -c 1 "$3" bench -t tcp -a 127.0.0.1 -s "$port" -n $nqn $4 \
    --rw "$rw" --bs "$bs" --qd "$qd" --runtime "${secs}s" --json > "$work/bench.json" 2> "$work/bench.err"; then
    echo "$2 bench failed:" >&2; tail -3 "$work/bench.err" >&2; tail -3 "$work/target.log" >&2; exit 1
  fi
  t1=$(cpu_ticks "$tpid"); end=$(date +%s%N)
  python3 -c '
import json, os, sys
r = json.load(open(sys.argv[1]))
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf("SC_CLK_TCK") / ((int(sys.argv[5]) - int(sys.argv[4])) / 1e9)
iops, per_io = r["iops"], r["cpu_us_per_io"]
print(f"{sys.argv[6]}|{sys.argv[7]} {iops} {per_io} {100 * cpu:.0f}")' \
    "$work/bench.json" "$t0" "$t1" "$start" "$end" "$1" "$2" >> "$work/pairs"
}

: > "$work/pairs"
for round in $(seq "$rounds"); do
  # Which target goes first alternates between rounds, as the hosts' order
  # rotates within each.
  order=("${targets[@]}")
  [ $((round % 2)) -eq 0 ] && [ ${#targets[@]} -eq 2 ] && order=("${targets[1]}" "${targets[0]}")
  for t in "${order[@]}"; do
    start_target "${t#*|}"
    n=${#hosts[@]}
    for i in $(seq 0 $((n - 1))); do
      h=${hosts[$(((i + round) % n))]}
      IFS='|' read -r label bin flags <<< "$h"
      measure "${t%%|*}" "$label" "$bin" "$flags"
    done
    stop_target
  done
  printf '\rround %d of %d' "$round" "$rounds" >&2
done
echo >&2

echo "$rw $bs QD$qd, ${secs} s, $rounds rounds, medians (host on core 1, target with one poller on core 0):"
python3 - "$work/pairs" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    key, iops, cpu, tcpu = line.rsplit(" ", 3)
    runs.setdefault(key, []).append((float(iops), float(cpu), float(tcpu)))
med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in runs.items()}
print(f"{'host -> target':<36}{'IOPS':>11}{'vs busy-poll':>14}{'host us/IO':>12}{'target CPU':>12}")
for key, (iops, cpu, tcpu) in med.items():
    target, host = key.split("|")
    ref = med.get(f"{target}|busy-poll", [iops])[0]
    print(f"{host + ' -> ' + target:<36}{iops:>11,.0f}{iops / ref:>13.2f}x{cpu:>12.2f}{tcpu:>11.0f}%")
EOF

# The NBD path, old binaries against new ones.
nbd_loads=${NBD_LOADS-"randread 4k 1,randread 4k 32"}
if [ -n "$old_bin" ] && [ -n "$nbd_loads" ]; then
  IFS=, read -ra loads <<< "$nbd_loads"
  : > "$work/nbd"
  for round in $(seq "$rounds"); do
    sets="new old"; [ $((round % 2)) -eq 0 ] && sets="old new"
    for set in $sets; do
      dir=$new_bin; [ "$set" = old ] && dir=$old_bin
      start_target "$dir/rdmablk-target"
      rm -f "$work/nbd.sock"; : > "$work/connect.out"
      taskset -c 0 "$dir/rdmablk" connect -t tcp -a 127.0.0.1 -s "$port" -n $nqn --nbd "unix:$work/nbd.sock" \
        > "$work/connect.out" 2> "$work/connect.log" &
      cpid=$!
      for _ in $(seq 100); do grep -q '^ready: ' "$work/connect.out" && break; sleep 0.1; done
      for load in "${loads[@]}"; do
        read -r lrw lbs lqd <<< "$load"
        taskset -c 1 fio --name=nbd --ioengine=nbd --uri="nbd+unix:///?socket=$work/nbd.sock" --rw="$lrw" \
          --bs="$lbs" --iodepth="$lqd" --size=512M --runtime="$secs" --time_based --output-format=json 2>/dev/null |
          python3 -c 'import json, sys; t = sys.stdin.read(); j = json.loads(t[t.index("{"):])["jobs"][0]
print(sys.argv[1], sys.argv[2].replace(" ", "_"), j["read"]["iops"] + j["write"]["iops"])' "$set" "$load" >> "$work/nbd"
      done
      kill "$cpid"; wait "$cpid" 2>/dev/null || true
      stop_target
    done
  done
  echo "NBD export (fio nbd engine -> rdmablk connect --nbd -> rdmablk-target), medians of $rounds rounds of ${secs} s:"
  python3 - "$work/nbd" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    which, load, iops = line.split()
    runs.setdefault((load, which), []).append(float(iops))
for load in dict.fromkeys(k[0] for k in runs):
    old, new = (statistics.median(runs.get((load, w), [0])) for w in ("old", "new"))
    # Old and new ran back to back in each round: the median of the rounds'
    # own ratios is steadier than the ratio of medians when the machine's
    # speed drifts between rounds.
    paired = statistics.median(n / o for n, o in zip(runs[(load, "new")], runs[(load, "old")]) if o)
    print(f"{load.replace('_', ' '):>18}: old {old:,.0f} IOPS, new {new:,.0f} IOPS, new/old {new / old if old else 0:.2f}x "
          f"(median of the rounds' ratios {paired:.2f}x)")
EOF
fi

# Idle: a target with one connected host (an NBD export, its engine
# threads waiting), both left alone; CPU use over the window.
[ "$idle_secs" -gt 0 ] || exit 0
idle() { # label target_bin host_bin
  start_target "$2"
  "$3" connect -t tcp -a 127.0.0.1 -s "$port" -n $nqn --nbd "unix:$work/idle.sock" \
    > "$work/connect.out" 2> "$work/connect.log" &
  local hpid=$! t0 h0 t1 h1
  for _ in $(seq 100); do grep -q '^ready: ' "$work/connect.out" && break; sleep 0.1; done
  sleep 1
  t0=$(cpu_ticks "$tpid"); h0=$(cpu_ticks "$hpid")
  sleep "$idle_secs"
  t1=$(cpu_ticks "$tpid"); h1=$(cpu_ticks "$hpid")
  kill "$hpid"; wait "$hpid" 2>/dev/null || true
  stop_target
  python3 -c '
import os, sys
tck, secs = os.sysconf("SC_CLK_TCK"), float(sys.argv[2])
t, h = (int(sys.argv[4]) - int(sys.argv[3])) / tck, (int(sys.argv[6]) - int(sys.argv[5])) / tck
print(f"idle {sys.argv[1]}: target {100 * t / secs:.2f}% of a core, connected host {100 * h / secs:.2f}% over {secs:.0f} s")' \
    "$1" "$idle_secs" "$t0" "$t1" "$h0" "$h1"
}
idle "defaults" "$new_bin/rdmablk-target" "$new_bin/rdmablk"
[ -z "$old_bin" ] || idle "old defaults" "$old_bin/rdmablk-target" "$old_bin/rdmablk"
