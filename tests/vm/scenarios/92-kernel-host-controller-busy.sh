# limits.connections with the Linux NVMe/TCP host: the daemon-wide queue
# limit is full (the kernel host's admin and I/O queue plus a filler); the
# kernel host's connection is cut (ss -K), fillers (hold_queues) take the
# freed places, and the kernel's reconnects are answered Controller Busy
# with DNR clear. A write issued meanwhile waits; once the fillers go, the
# kernel reconnects (it never gives up: DNR is clear), the write completes
# and reads back, all well within ctrl_loss_tmo.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
/usr/bin/modprobe tcp_diag || fail "modprobe tcp_diag (ss -K needs it)"
NQN=nqn.2026-11.io.rdmablk:vm-busy
BUSY="Connect refused with Controller Busy (the host may retry)"
# The kernel host uses port 4490, the fillers 4491: ss -K can cut the
# kernel's connections alone.
cat > /tmp/busy.toml <<EOF
[limits]
connections = 3

[[listener]]
transport = "tcp"
address = "127.0.0.1:4490"

[[listener]]
transport = "tcp"
address = "127.0.0.1:4491"

[[subsystem]]
nqn = "$NQN"
allow_any_host = true

    [[subsystem.namespace]]
    backend = "memory"
    size = "64MiB"
EOF
HPIDS=""
cleanup() {
  for p in $HPIDS; do kill -KILL "$p" 2>/dev/null; done
  /usr/bin/nvme disconnect -n $NQN >/dev/null 2>&1
  [ -n "${TARGET_PID:-}" ] && kill -KILL "$TARGET_PID" 2>/dev/null
}
trap cleanup EXIT
start_target /tmp/target.log --config /tmp/busy.toml --stats /tmp/stats.json
wait_for 10 grep -q "listening on tcp://127.0.0.1:4491" /tmp/target.log || fail "no listener on 4491"

# The kernel host: admin queue and one I/O queue (2 of 3 places).
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4490 -n $NQN -i 1 --reconnect-delay=1 --ctrl-loss-tmo=60 ||
  fail "nvme connect"
wait_for 20 nvme_blk $NQN || fail "no block device"
dev=$(nvme_blk $NQN)
ctrl=""
for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn 2>/dev/null)" = $NQN ] && ctrl=${c##*/}; done
[ -n "$ctrl" ] || fail "no controller of $NQN in /sys/class/nvme"
wait_for 5 grep -q '"queues_connected":2,' /tmp/stats.json || fail "the kernel host should hold 2 queues: $(cat /tmp/stats.json)"
dd if=/dev/urandom of=/tmp/a bs=1M count=4 2>/dev/null
dd if=/tmp/a of=$dev bs=1M oflag=direct 2>/dev/null || fail "write before the cut"

# Filler A takes the last place; filler B wants two more and is refused
# (Controller Busy, DNR clear) while it retries.
hold_queues 127.0.0.1:4491 $NQN --count 1 --hostnqn-prefix nqn.2026-11.io.rdmablk:fill-a > /tmp/hold-a.out 2> /tmp/hold-a.log &
HPIDS="$HPIDS $!"
wait_for 10 grep -q "^holding 1" /tmp/hold-a.out || fail "filler A did not get its place"
wait_for 5 grep -q '"queues_connected":3,' /tmp/stats.json || fail "the limit is not full: $(cat /tmp/stats.json)"
hold_queues 127.0.0.1:4491 $NQN --count 2 --retry 20ms --hostnqn-prefix nqn.2026-11.io.rdmablk:fill-b > /tmp/hold-b.out 2> /tmp/hold-b.log &
HPIDS="$HPIDS $!"
wait_for 10 grep -q "^busy: " /tmp/hold-b.out || fail "filler B was not answered Controller Busy: $(cat /tmp/hold-b.out /tmp/hold-b.log)"
grep -q "^held" /tmp/hold-b.out && fail "filler B got a place beyond limits.connections"
say "limits.connections full: $(cat /tmp/stats.json); filler B: $(head -1 /tmp/hold-b.out)"

# Cut the kernel host's connections (both ends; not the listener).
/usr/bin/ss -tn state established '( dport = :4490 or sport = :4490 )' > /tmp/ss.txt
[ "$(grep -c 127.0.0.1 /tmp/ss.txt)" = 4 ] || { cat /tmp/ss.txt; fail "expected the kernel host's 2 connections (4 sockets)"; }
t0=$(cut -d' ' -f1 /proc/uptime)
/usr/bin/ss -K -tn state established '( dport = :4490 or sport = :4490 )' > /dev/null ||
  fail "ss -K failed (CONFIG_INET_DIAG_DESTROY?)"
wait_for 10 grep -q "^holding 2" /tmp/hold-b.out ||
  fail "filler B did not take the places the kernel host left: $(cat /tmp/stats.json) $(cat /tmp/hold-b.out)"
n0=$(grep -c "$BUSY" /tmp/target.log)
say "connections cut; fillers hold every place: $(cat /tmp/stats.json)"

# A write issued during the cut waits.
dd if=/dev/urandom of=/tmp/b bs=1M count=4 2>/dev/null
dd if=/tmp/b of=$dev bs=1M seek=4 oflag=direct 2>/tmp/dd.log &
DD=$!
# Only the kernel host connects now: new Controller Busy refusals are its
# reconnect attempts (the log says one a second at most).
wait_for 15 sh -c "[ \$(grep -c '$BUSY' /tmp/target.log) -gt $n0 ]" ||
  fail "no Controller Busy refusal of the kernel host's reconnects"
sleep 2
kill -0 $DD 2>/dev/null || fail "the write ended while the kernel host could not reconnect: $(cat /tmp/dd.log)"
grep "$BUSY" /tmp/target.log | tail -2
dmesg | grep "nvme $ctrl:" | tail -6
dmesg | grep "nvme $ctrl:" | grep -q "Removing controller\|will not retry" && fail "the kernel host gave up on Controller Busy"
[ -e /sys/class/nvme/$ctrl ] || fail "$ctrl is gone"
say "$ctrl during the cut: $(cat /sys/class/nvme/$ctrl/state); dd still waiting"

# The fillers go: the kernel reconnects and the write completes.
for p in $HPIDS; do kill -TERM "$p"; wait "$p" 2>/dev/null; done
HPIDS=""
wait $DD || fail "the write issued during the cut failed: $(cat /tmp/dd.log)"
t1=$(cut -d' ' -f1 /proc/uptime)
say "the write completed after the reconnect, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s after the cut (ctrl_loss_tmo 60 s)"
[ "$(nvme_blk $NQN)" = "$dev" ] || fail "the namespace came back as $(nvme_blk $NQN), not $dev"
dd if=$dev of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null || fail "read back"
cat /tmp/a /tmp/b | cmp - /tmp/back || fail "data differs after the reconnect"
wait_for 5 grep -q '"queues_connected":2,' /tmp/stats.json || fail "expected the kernel host's 2 queues: $(cat /tmp/stats.json)"
# The kernel read the status as Controller Busy without DNR (0x181).
dmesg | grep "nvme $ctrl:" | grep -q "controller is busy\|ret=385" ||
  fail "the kernel host did not log a Controller Busy Connect failure"
/usr/bin/nvme disconnect -n $NQN || fail "nvme disconnect"
stop_target
TARGET_PID=""
grep -E " (WARN|ERROR) " /tmp/target.log | grep -v "$BUSY" | head -5
say "kernel host through Controller Busy: all checks passed"
