# The same load (4 KiB random read, QD 32, O_DIRECT, io_uring) against
# /dev/nvmeXnY from rdmablk-target and from Linux nvmet-tcp, both backed by a
# file on tmpfs, in one boot. Prints both results side by side.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
truncate -s 256M /tmp/ours.img /tmp/theirs.img
OURS=nqn.2026-11.io.rdmablk:vm-ours
THEIRS=nqn.2026-11.io.rdmablk:vm-theirs
start_target /tmp/target.log --listen tcp://127.0.0.1:4440 --file /tmp/ours.img --nqn $OURS
nvmet_tcp_export $THEIRS /tmp/theirs.img 4441
for side in ours:4440:$OURS theirs:4441:$THEIRS; do
  name=${side%%:*}; rest=${side#*:}; port=${rest%%:*}; nqn=${rest#*:}
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $port -n $nqn -i 1 || fail "connect $name"
  wait_for 20 nvme_blk $nqn || fail "no block device for $name"
  dev=$(nvme_blk $nqn)
  dd if=/dev/zero of=$dev bs=1M count=64 oflag=direct 2>/dev/null
  blkload $dev --rw randread --bs 4k --qd 32 --runtime 8s > /tmp/load-$name.txt || fail "blkload $name"
  blkload $dev --rw read --bs 128k --qd 8 --runtime 5s >> /tmp/load-$name.txt || fail "blkload seq $name"
  /usr/bin/nvme disconnect -n $nqn
done
echo "COMPARE rdmablk-target: $(head -1 /tmp/load-ours.txt)"
echo "COMPARE nvmet-tcp:      $(head -1 /tmp/load-theirs.txt)"
echo "COMPARE rdmablk-target: $(tail -1 /tmp/load-ours.txt)"
echo "COMPARE nvmet-tcp:      $(tail -1 /tmp/load-theirs.txt)"
stop_target
