#!/usr/bin/awk -f
# Reads the "COMPARE LOAD SIDE LINE" lines a VM console log holds (written
# by tests/vm/scenarios/lib.sh's `compare`) and prints, per load, each
# side's figure and the ratio of the first side to the second: IOPS where
# the line has them, else microseconds of CPU per I/O (lower is better).
function figure(line,   m) {
  if (match(line, /[0-9.]+ IOPS/)) { unit = "IOPS"; return substr(line, RSTART, RLENGTH - 5) + 0 }
  if (match(line, /[0-9.]+ us per I\/O/)) { unit = "us/IO"; return substr(line, RSTART, RLENGTH - 11) + 0 }
  unit = "?"; return 0
}
/^COMPARE / {
  load = $2; side = $3
  line = $0; sub(/^COMPARE [^ ]+ [^ ]+ /, "", line)
  v = figure(line)
  if (!(load in first)) { order[++n] = load; first[load] = side; a[load] = v; units[load] = unit }
  else if (!(load in second)) { second[load] = side; b[load] = v }
}
END {
  if (n == 0) { print "no COMPARE lines: did the scenarios run?" > "/dev/stderr"; exit 1 }
  printf "%-26s %-16s %10s %-16s %10s %-6s %7s\n", "load", "side A", "A", "side B", "B", "unit", "A/B"
  for (i = 1; i <= n; i++) {
    l = order[i]
    r = (b[l] > 0) ? sprintf("%.2f", a[l] / b[l]) : "-"
    printf "%-26s %-16s %10s %-16s %10s %-6s %7s\n", l, first[l], a[l], second[l], b[l], units[l], r
  }
}
