# The Linux host keeps its /dev/nvmeXnY across a restart of rdmablk-target
# (SIGKILL, then a new daemon on the same file): the identity the target
# reports (serial, NGUID, UUID) is stable, so the kernel reconnects the same
# namespace, and data written before and during the outage reads back.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-reconnect
truncate -s 64M /tmp/re.img
start_target /tmp/target.log --listen tcp://127.0.0.1:4425 --file /tmp/re.img --nqn $NQN
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4425 -n $NQN --reconnect-delay=1 --ctrl-loss-tmo=60 \
  || fail "nvme connect"
wait_for 20 nvme_blk $NQN || fail "no block device"
dev=$(nvme_blk $NQN)
dd if=/dev/urandom of=/tmp/a bs=1M count=4 2>/dev/null
dd if=/tmp/a of=$dev bs=1M oflag=direct 2>/dev/null || fail "write before the outage"
kill -KILL $TARGET_PID; wait $TARGET_PID 2>/dev/null
say "target killed; writing during the outage"
dd if=/dev/urandom of=/tmp/b bs=1M count=4 2>/dev/null
dd if=/tmp/b of=$dev bs=1M seek=4 oflag=direct 2>/tmp/dd.log &
DD=$!
sleep 2
mv /tmp/target.log /tmp/target-first.log
start_target /tmp/target.log --listen tcp://127.0.0.1:4425 --file /tmp/re.img --nqn $NQN
wait $DD || fail "the write issued during the outage failed: $(cat /tmp/dd.log)"
say "the write issued during the outage completed after the restart"
dd if=$dev of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null || fail "read back"
cat /tmp/a /tmp/b | cmp - /tmp/back || fail "data differs after the reconnect"
[ "$(nvme_blk $NQN)" = "$dev" ] || fail "the namespace came back as $(nvme_blk $NQN), not $dev"
/usr/bin/nvme disconnect -n $NQN || fail "nvme disconnect"
stop_target
say "kernel host across a target restart: all checks passed"
