# /dev/ublkbN over NVMe/RDMA rides through a SIGKILL and restart of the
# target: the host re-establishes the association and gives its engines new
# queue pairs (their arena registered again), the I/O that waited is issued
# again, and a write stream running across it completes and verifies.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe ublk_drv || fail "modprobe ublk_drv"
NQN=nqn.2026-11.io.rdmablk:vm-ublk-restart
truncate -s 256M /tmp/restart.img
TARGS="--listen rdma://$RDMA_IP:4480 --file /tmp/restart.img --nqn $NQN"
start_target /tmp/target.log $TARGS
ublk_up /tmp/ublk-restart.log -t rdma -a "$RDMA_IP" -s 4480 -n $NQN --ublk-id 5 --queues 2 -l 60
/usr/bin/fio --name=stream --filename=$UBLK_DEV --ioengine=io_uring --direct=1 --rw=write --bs=128k \
  --iodepth=8 --size=64M --verify=crc32c --do_verify=1 --verify_fatal=1 --eta=never --output=/tmp/fio-restart.log &
FIO=$!
sleep 2
kill -0 $FIO || fail "the write stream ended before the target restart"
kill -9 $TARGET_PID; wait $TARGET_PID 2>/dev/null
say "rdmablk-target killed with SIGKILL during the stream"
sleep 2
start_target /tmp/target2.log $TARGS
wait $FIO; rc=$?
[ $rc -eq 0 ] || { tail -30 /tmp/fio-restart.log; fail "the write stream failed across the target restart (fio exit $rc)"; }
grep -q "err= *[1-9]\|verify:.*bad" /tmp/fio-restart.log && { tail -30 /tmp/fio-restart.log; fail "fio saw errors"; }
grep -q "association re-established" /tmp/ublk-restart.log || fail "no reconnect in the host's log"
say "write stream of 64 MiB across a target SIGKILL and restart: no I/O error, data verified"
ublk_down
stop_target
say "ublk over RDMA across a target restart: all checks passed"
