# rdmablk host -> rdmablk-target over soft-RoCE: bench --verify with 4 KiB
# and 1 MiB blocks at QD 32 (and 4 KiB busy polling), an NBD export driven by fio with verify, and a
# host killed mid-write: the target keeps serving and every arena buffer
# comes back (read from the target's stats file). First, rdma_keys: the
# host's keys reach one command's buffer, in its direction, while it runs
# (memory windows and registrations per command).
. /scenarios/lib.sh
rxe_up
rdma_keys "$RDMA_IP" > /tmp/keys.log 2>&1 || { cat /tmp/keys.log; fail "rdma_keys: a target reached host memory beyond a command in flight"; }
cat /tmp/keys.log
[ "$(grep -c '^ok: ' /tmp/keys.log)" -eq 6 ] || fail "rdma_keys ran $(grep -c '^ok: ' /tmp/keys.log) of 6 cases"
NQN=nqn.2026-11.io.rdmablk:vm-rdma
start_target /tmp/target.log --listen "rdma://$RDMA_IP:4420" --memory 256MiB --nqn $NQN --stats /tmp/stats.json
T="-t rdma -a $RDMA_IP -s 4420 -n $NQN"
RUST_LOG=rdmablk=debug rdmablk bench $T --rw randrw --bs 4k --qd 32 --runtime 3s --verify > /tmp/bench.log 2>&1 || fail "bench --verify 4k over rdma"
tail -2 /tmp/bench.log
# Soft-RoCE runs a queue pair's window binds again when it retransmits after
# an RNR NAK: on rxe the host registers each command's buffer instead.
grep -q 'remote_access=Registrations' /tmp/bench.log || fail "the host did not register per command on rxe: $(grep -m1 'queue connected' /tmp/bench.log)"
rdmablk bench $T --rw randrw --bs 1m --qd 32 --runtime 3s --verify > /tmp/bench2.log 2>&1 || fail "bench --verify 1 MiB over rdma"
tail -2 /tmp/bench2.log
# Busy polling takes completions straight from the CQ, with no completion
# channel event: the same verified load.
rdmablk bench $T --rw randrw --bs 4k --qd 32 --runtime 3s --verify --busy-poll > /tmp/bench-busy.log 2>&1 ||
  fail "bench --busy-poll --verify over rdma: $(tail -3 /tmp/bench-busy.log)"
tail -2 /tmp/bench-busy.log

/usr/bin/modprobe nbd || fail "modprobe nbd"
: > /tmp/connect.out  # no earlier scenario's "ready: " for the wait to find
rdmablk connect $T --nbd unix:/tmp/rdma.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect -t rdma did not become ready"
/usr/bin/nbd-client -unix /tmp/rdma.sock /dev/nbd0 -b 4096 || fail "nbd-client"
fio --name=nbd-verify --filename=/dev/nbd0 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
  --iodepth=16 --size=16M --verify=crc32c --do_verify=1 --verify_fatal=1 --eta=never --output=/tmp/fio.log || { cat /tmp/fio.log; fail "fio verify on /dev/nbd0 over rdma"; }
grep -qi "verify:.*bad\|crc32c: verify failed" /tmp/fio.log && fail "fio reported verify errors"
say "fio randwrite + verify through NBD over NVMe/RDMA passed"
/usr/bin/nbd-client -d /dev/nbd0
kill -TERM $CPID; wait $CPID || fail "rdmablk connect exited non-zero"

# A host killed in the middle of a write stream: the target must drop its
# queues and give back every buffer, and keep serving new hosts.
rdmablk bench $T --rw write --bs 128k --qd 32 --runtime 30s > /tmp/killed.log 2>&1 &
BPID=$!
wait_for 20 grep -q '"arena_buffers_in_use":\[[0-9,]*[1-9]' /tmp/stats.json ||
  fail "no buffers in use while the host writes: $(cat /tmp/stats.json)"
say "mid-write: $(cat /tmp/stats.json)"
kill -9 $BPID; wait $BPID 2>/dev/null
wait_for 30 grep -q '"connections":0' /tmp/stats.json || fail "target still has connections after the host died: $(cat /tmp/stats.json)"
wait_for 10 grep -q '"arena_buffers_in_use":\[0\(,0\)*\]' /tmp/stats.json || fail "arena buffers leaked: $(cat /tmp/stats.json)"
say "after kill -9 of the host: $(cat /tmp/stats.json)"
rdmablk bench $T --rw randrw --bs 4k --qd 32 --runtime 2s --verify > /tmp/bench3.log 2>&1 || fail "bench after the killed host"
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
grep -E " (WARN|ERROR) " /tmp/target.log | head -5
say "rdmablk host over RDMA: all checks passed"
