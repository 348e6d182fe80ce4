# The Linux host against a wildcard NVMe/TCP listener with two subsystems:
# nvme discover shows the guest's own address (never 0.0.0.0) and the
# current discovery subsystem's entry (DUPRETINFO, EPCSD), and nvme
# connect-all connects once per subsystem and not again to the discovery
# subsystem itself.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
IP=$(/usr/bin/ip -4 -o addr show dev eth0 2>/dev/null | awk '{sub("/.*", "", $4); print $4; exit}')
[ -n "$IP" ] || fail "eth0 has no IPv4 address"
A=nqn.2026-11.io.rdmablk:vm-disc-a
B=nqn.2026-11.io.rdmablk:vm-disc-b
cat > /tmp/disc.toml <<EOF
[[listener]]
transport = "tcp"
address = "0.0.0.0:4430"

[[subsystem]]
nqn = "$A"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "memory"
  size = "64MiB"

[[subsystem]]
nqn = "$B"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "memory"
  size = "32MiB"
EOF
start_target /tmp/target.log --config /tmp/disc.toml
/usr/bin/nvme discover -t tcp -a "$IP" -s 4430 > /tmp/discover.log 2>&1 || fail "nvme discover"
grep -q "subtype: current discovery subsystem" /tmp/discover.log ||
  fail "no current discovery subsystem entry: $(cat /tmp/discover.log)"
grep -qi "eflags: .*explicit discovery connections.*duplicate discovery information" /tmp/discover.log ||
  fail "current discovery entry without EPCSD and DUPRETINFO: $(grep eflags /tmp/discover.log)"
grep -q "traddr: *0.0.0.0" /tmp/discover.log && fail "the wildcard address is advertised: $(grep traddr /tmp/discover.log)"
[ "$(grep -Ec "traddr: +$IP *$" /tmp/discover.log)" = 3 ] ||
  fail "expected 3 entries at $IP: $(grep traddr /tmp/discover.log)"
say "nvme discover: 3 entries at $IP, the current discovery subsystem among them"
/usr/bin/nvme connect-all -t tcp -a "$IP" -s 4430 > /tmp/connect-all.log 2>&1 || fail "nvme connect-all"
wait_for 20 nvme_blk $A || fail "no block device for $A"
wait_for 20 nvme_blk $B || fail "no block device for $B"
ctrls() { n=0; for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && n=$((n + 1)); done; echo $n; }
[ "$(ctrls $A)" = 1 ] || fail "$(ctrls $A) controllers for $A"
[ "$(ctrls $B)" = 1 ] || fail "$(ctrls $B) controllers for $B"
[ "$(ctrls nqn.2014-08.org.nvmexpress.discovery)" = 0 ] || fail "connect-all kept a discovery controller"
verify_blockdev "$(nvme_blk $B)" 8
say "nvme connect-all: one controller each for $A and $B"
/usr/bin/nvme disconnect-all > /dev/null 2>&1 || fail "nvme disconnect-all"
stop_target
