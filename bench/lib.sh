# Shared by bench/targets.sh and bench/hosts.sh: a scratch directory and a
# target process cleaned up at exit, free ports, and each load run against an
# old and a new binary in interleaved rounds with the medians and the ratios
# new/old. The caller defines `measure BINARY RW BS QD`, which prints
# "IOPS CPU_US_PER_IO" and keeps the target's pid in $tpid while it runs.

work=$(mktemp -d /tmp/rdmablk-compare.XXXXXX)
tpid=""
cleanup() { [ -n "$tpid" ] && kill "$tpid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# A free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# compare_loads OLD NEW ROUNDS "RW BS QD,RW BS QD,..."
compare_loads() {
  local old=$1 new=$2 rounds=$3 load
  local -a loads
  IFS=, read -ra loads <<< "$4"
  for load in "${loads[@]}"; do
    set -- $load
    : > "$work/old"; : > "$work/new"
    # Which binary goes first alternates between rounds: on a shared
    # machine the second run of a round can measure a few percent lower
    # whichever binary it is.
    for round in $(seq "$rounds"); do
      if [ $((round % 2)) -eq 1 ]; then
        measure "$old" "$1" "$2" "$3" >> "$work/old"
        measure "$new" "$1" "$2" "$3" >> "$work/new"
      else
        measure "$new" "$1" "$2" "$3" >> "$work/new"
        measure "$old" "$1" "$2" "$3" >> "$work/old"
      fi
    done
    python3 - "$work/old" "$work/new" "$1 $2 QD$3" <<'EOF'
import statistics, sys
def load(p):
    rows = [tuple(map(float, l.split())) for l in open(p) if l.strip()]
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
(oi, oc), (ni, nc) = load(sys.argv[1]), load(sys.argv[2])
print(f"{sys.argv[3]:>16}: old {oi:,.0f} IOPS {oc:.2f} us CPU/IO | new {ni:,.0f} IOPS {nc:.2f} us CPU/IO"
      f" | new/old IOPS {ni/oi:.3f}x, CPU/IO {nc/oc:.3f}x")
EOF
  done
}
