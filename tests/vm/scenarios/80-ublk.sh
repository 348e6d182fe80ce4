# rdmablk connect --ublk: /dev/ublkbN over NVMe/TCP to rdmablk-target and to
# Linux nvmet-tcp, and over NVMe/RDMA (rxe) to rdmablk-target: 64 MiB of
# O_DIRECT random writes verified, ext4 with files across a remount, removal
# on SIGTERM, the freed id used again; then `kill -9` of the server during a
# write stream and a restart with the same id: the stream completes without
# an I/O error and its data verifies.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe ublk_drv || fail "modprobe ublk_drv"
NQN=nqn.2026-11.io.rdmablk:vm-ublk
THEIRS=nqn.2026-11.io.rdmablk:vm-ublk-nvmet
truncate -s 256M /tmp/ublk.img /tmp/ublk-nvmet.img
start_target /tmp/target.log --listen tcp://127.0.0.1:4460 --listen "rdma://$RDMA_IP:4461" --file /tmp/ublk.img --nqn $NQN
nvmet_tcp_export $THEIRS /tmp/ublk-nvmet.img 4462
# The RDMA device has two queues (two engines, two NVMe I/O queues).
for t in "tcp 127.0.0.1 4460 $NQN 1" "rdma $RDMA_IP 4461 $NQN 2" "tcp 127.0.0.1 4462 $THEIRS 1"; do
  set -- $t
  ublk_up /tmp/ublk.log -t $1 -a $2 -s $3 -n $4 --ublk-id 0 --queues $5
  [ "$(ls -d /sys/block/ublkb0/mq/* | wc -l)" = $5 ] || fail "ublkb0 does not have $5 queues"
  [ "$UBLK_DEV" = /dev/ublkb0 ] || fail "got $UBLK_DEV, asked for id 0"
  [ "$(blockdev --getsize64 $UBLK_DEV)" = 268435456 ] || fail "$UBLK_DEV has the wrong size"
  say "-t $1 to port $3: $UBLK_DEV with $5 queue(s)"
  fio_verify $UBLK_DEV 64M
  verify_ext4 $UBLK_DEV
  ublk_down
done
say "three connects reused the freed id 0"

# kill -9 mid-stream, restart with the same id: the stream must not see an error.
ublk_up /tmp/ublk-crash.log -t rdma -a "$RDMA_IP" -s 4461 -n $NQN --ublk-id 3
/usr/bin/fio --name=stream --filename=$UBLK_DEV --ioengine=io_uring --direct=1 --rw=write --bs=128k \
  --iodepth=8 --size=96M --verify=crc32c --do_verify=1 --verify_fatal=1 --eta=never --output=/tmp/fio-stream.log &
FIO=$!
sleep 3
kill -0 $FIO || fail "the write stream ended before the crash"
kill -9 $UBLK_PID; wait $UBLK_PID 2>/dev/null
say "rdmablk connect killed with SIGKILL during the stream"
[ -b /dev/ublkb3 ] || fail "the device went away with its server (no user recovery)"
ublk_up /tmp/ublk-crash2.log -t rdma -a "$RDMA_IP" -s 4461 -n $NQN --ublk-id 3
grep -q "recover" /tmp/ublk-crash2.log || fail "the restarted server did not recover the device"
wait $FIO; rc=$?
[ $rc -eq 0 ] || { tail -30 /tmp/fio-stream.log; fail "the write stream failed across the crash (fio exit $rc)"; }
grep -q "err= *[1-9]\|verify:.*bad" /tmp/fio-stream.log && { tail -30 /tmp/fio-stream.log; fail "fio saw errors across the crash"; }
say "write stream of 96 MiB across kill -9 and recovery: no I/O error, data verified"
ublk_down
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
say "ublk front-end: all checks passed"
