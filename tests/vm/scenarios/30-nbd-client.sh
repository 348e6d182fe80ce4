# Linux nbd-client -> rdmablk connect --nbd -> rdmablk-target: /dev/nbd0 as
# a disk: O_DIRECT write/read-back, ext4 with files across a remount.
. /scenarios/lib.sh
/usr/bin/modprobe nbd || fail "modprobe nbd"
NQN=nqn.2026-11.io.rdmablk:vm-nbd
start_target /tmp/target.log --listen tcp://127.0.0.1:4430 --memory 256MiB --nqn $NQN
: > /tmp/connect.out  # no earlier scenario's "ready: " for the wait to find
rdmablk connect -t tcp -a 127.0.0.1 -s 4430 -n $NQN --nbd unix:/tmp/export.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: nbd+unix:///?socket=/tmp/export.sock" /tmp/connect.out || fail "rdmablk connect not ready"
/usr/bin/nbd-client -unix /tmp/export.sock /dev/nbd0 -b 4096 || fail "nbd-client"
size=$(blockdev --getsize64 /dev/nbd0)
[ "$size" = 268435456 ] || fail "/dev/nbd0 has $size bytes"
verify_blockdev /dev/nbd0 16
verify_ext4 /dev/nbd0
/usr/bin/nbd-client -d /dev/nbd0 || fail "nbd-client -d"
kill -TERM $CPID; wait $CPID || fail "rdmablk connect exited non-zero"
stop_target
say "kernel nbd client through rdmablk: all checks passed"
