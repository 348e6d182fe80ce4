# limits.send_timeout over soft-RoCE: a host that posts reads and then no
# receive for their responses (rdma_stall) holds the target's arena buffers
# while the target's response SENDs get RNR NAKs; the target tears that
# queue down within send_timeout (+ its tick), every buffer comes back, and
# a well-behaved host's verified I/O meanwhile sees no error.
. /scenarios/lib.sh
rxe_up
NQN=nqn.2026-11.io.rdmablk:vm-stall
SEND_TIMEOUT=5
cat > /tmp/stall.toml <<EOF
[limits]
send_timeout = "${SEND_TIMEOUT}s"

[[listener]]
transport = "rdma"
address = "$RDMA_IP:4420"

[[subsystem]]
nqn = "$NQN"
allow_any_host = true

    [[subsystem.namespace]]
    backend = "memory"
    size = "256MiB"
EOF
SPID=""; BPID=""
cleanup() {
  for p in $SPID $BPID ${TARGET_PID:-}; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT
start_target /tmp/target.log --config /tmp/stall.toml --stats /tmp/stats.json
BUSY='"arena_buffers_in_use":\[[0-9,]*[1-9]'
IDLE='"arena_buffers_in_use":\[0\(,0\)*\]'
CLOSED="queue closed: the host did not take what was sent to it (no send completed) within limits.send_timeout"
wait_for 10 grep -q "$IDLE" /tmp/stats.json || fail "arena buffers in use before any host: $(cat /tmp/stats.json)"

# The misbehaving host: 32 reads of 128 KiB on a 32-entry I/O queue, no
# receives for their responses, then silence.
rdma_stall "$RDMA_IP:4420" $NQN --reads 32 --bs 128k --hold 90s > /tmp/stall.out 2> /tmp/stall.log &
SPID=$!
wait_for 30 grep -q '^stalled: ' /tmp/stall.out || fail "rdma_stall did not post its reads: $(cat /tmp/stall.log)"
t0=$(cut -d' ' -f1 /proc/uptime)
say "$(cat /tmp/stall.out)"
wait_for 3 grep -q "$BUSY" /tmp/stats.json || fail "no arena buffers held for the stalled reads: $(cat /tmp/stats.json)"
say "stalled host holds buffers: $(cat /tmp/stats.json)"
grep -q "$CLOSED" /tmp/target.log && fail "the stalled queue was closed before the well-behaved host started"

# The well-behaved host, meanwhile: verified random I/O for 20 s.
T="-t rdma -a $RDMA_IP -s 4420 -n $NQN"
rdmablk bench $T --rw randrw --bs 64k --qd 16 --runtime 20s --verify > /tmp/bench.log 2>&1 &
BPID=$!

# The stalled queue goes within send_timeout (+ up to 5 s of tick and
# teardown) of the moment its reads were posted.
limit=$((SEND_TIMEOUT + 5))
i=0
while ! grep -q "$CLOSED" /tmp/target.log; do
  i=$((i + 1)); [ $i -gt $((limit * 10)) ] && break; sleep 0.1
done
t1=$(cut -d' ' -f1 /proc/uptime)
el=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
grep -q "$CLOSED" /tmp/target.log || fail "the stalled queue was not closed for send_timeout within ${limit}s: $(cat /tmp/stats.json)"
awk -v e="$el" -v s="$SEND_TIMEOUT" 'BEGIN { exit !(e >= s - 1) }' ||
  fail "the queue was closed ${el}s after the stall, before send_timeout (${SEND_TIMEOUT}s)"
say "target closed the stalled queue ${el}s after the reads were posted (send_timeout ${SEND_TIMEOUT}s):"
grep "$CLOSED" /tmp/target.log
[ "$(grep -c "$CLOSED" /tmp/target.log)" = 1 ] || fail "more than one queue closed for send_timeout"
kill -0 $SPID 2>/dev/null || fail "rdma_stall exited early: $(cat /tmp/stall.log)"

wait $BPID || { cat /tmp/bench.log; fail "the well-behaved host's bench --verify failed"; }
tail -3 /tmp/bench.log
grep -q "verify errors: 0" /tmp/bench.log || fail "bench reported verify errors"
grep -E "^ *(read|write):" /tmp/bench.log | grep -vq " 0 errors" && fail "bench reported I/O errors"
wait_for 10 grep -q "$IDLE" /tmp/stats.json || fail "arena buffers not all back: $(cat /tmp/stats.json)"
say "after the good host finished: $(cat /tmp/stats.json)"

# The stalled host's admin queue is still there (it holds no buffer); its
# end is an ordinary disconnect.
kill -TERM $SPID; wait $SPID 2>/dev/null
SPID=""; BPID=""
wait_for 30 grep -q '"connections":0' /tmp/stats.json || fail "connections left after rdma_stall exited: $(cat /tmp/stats.json)"
grep -q "$IDLE" /tmp/stats.json || fail "arena buffers in use at the end: $(cat /tmp/stats.json)"
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
TARGET_PID=""
grep -E " (WARN|ERROR) " /tmp/target.log | head -5
say "stalled RDMA host: all checks passed"
