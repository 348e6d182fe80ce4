# Shared by bench scripts that measure a target process's CPU time while
# `rdmablk bench` drives it.

# cpu_ticks PID: the process's user and system clock ticks so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# iops_and_cpu_per_io JSON TICKS0 TICKS1: "IOPS CPU_US_PER_IO" of a bench
# run (its --json output), the CPU time what the ticks measured over it.
iops_and_cpu_per_io() {
  python3 -c '
import json, os, sys
r = json.loads(sys.argv[1]); hz = os.sysconf("SC_CLK_TCK")
ios = r["read"]["ios"] + r["write"]["ios"]
print(r["iops"], (int(sys.argv[3]) - int(sys.argv[2])) / hz * 1e6 / max(ios, 1))
' "$1" "$2" "$3"
}
