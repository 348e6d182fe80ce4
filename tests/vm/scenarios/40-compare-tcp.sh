# The same load (4 KiB random read QD 32, 128 KiB sequential read QD 8;
# O_DIRECT, io_uring) against /dev/nvmeXnY from rdmablk-target and from
# Linux nvmet-tcp, both backed by a file on tmpfs, in one boot: each load
# runs and moves data on both. The figures are bench/vm.sh's (it boots with
# VM_MEASURE=1 for loads of 8 and 5 s; here they run 1 s).
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
truncate -s 256M /tmp/ours.img /tmp/theirs.img
OURS=nqn.2026-11.io.rdmablk:vm-ours
THEIRS=nqn.2026-11.io.rdmablk:vm-theirs
start_target /tmp/target.log --listen tcp://127.0.0.1:4440 --file /tmp/ours.img --nqn $OURS
nvmet_tcp_export $THEIRS /tmp/theirs.img 4441
for side in rdmablk-target:4440:$OURS nvmet-tcp:4441:$THEIRS; do
  name=${side%%:*}; rest=${side#*:}; port=${rest%%:*}; nqn=${rest#*:}
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $port -n $nqn -i 1 || fail "connect $name"
  wait_for 20 nvme_blk $nqn || fail "no block device for $name"
  dev=$(nvme_blk $nqn)
  dd if=/dev/zero of=$dev bs=1M count="$(suite_or_bench 8 64)" oflag=direct 2>/dev/null
  blkload $dev --rw randread --bs 4k --qd 32 --runtime "$(suite_or_bench 1 8)s" > /tmp/rand-$name.txt || fail "blkload $name"
  blkload $dev --rw read --bs 128k --qd 8 --runtime "$(suite_or_bench 1 5)s" > /tmp/seq-$name.txt || fail "blkload seq $name"
  /usr/bin/nvme disconnect -n $nqn
done
for name in rdmablk-target nvmet-tcp; do compare tcp-randread-4k-qd32 $name /tmp/rand-$name.txt; done
for name in rdmablk-target nvmet-tcp; do compare tcp-read-128k-qd8 $name /tmp/seq-$name.txt; done
stop_target
