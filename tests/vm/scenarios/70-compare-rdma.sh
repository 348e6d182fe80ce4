# Over soft-RoCE, in one boot: the same fio load (4 KiB random read QD 32,
# 128 KiB sequential read QD 8; O_DIRECT, io_uring) on /dev/nvmeXnY from
# rdmablk-target and from Linux nvmet-rdma (both backed by a file on tmpfs),
# `rdmablk bench` against both (sleeping and busy polling), and perftest's ib_write_bw / ib_read_bw as
# the ceiling. Prints COMPARE lines; figures are only ratios (TCG).
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
truncate -s 256M /tmp/ours-rdma.img /tmp/theirs-rdma.img
OURS=nqn.2026-11.io.rdmablk:vm-ours-rdma
THEIRS=nqn.2026-11.io.rdmablk:vm-theirs-rdma
start_target /tmp/target.log --listen "rdma://$RDMA_IP:4450" --file /tmp/ours-rdma.img --nqn $OURS
nvmet_rdma_export $THEIRS /tmp/theirs-rdma.img 4451

for side in ours:4450:$OURS theirs:4451:$THEIRS; do
  name=${side%%:*}; rest=${side#*:}; port=${rest%%:*}; nqn=${rest#*:}
  /usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s $port -n $nqn -i 1 || fail "connect $name"
  wait_for 20 nvme_blk $nqn || fail "no block device for $name"
  dev=$(nvme_blk $nqn)
  dd if=/dev/zero of=$dev bs=1M count=64 oflag=direct 2>/dev/null
  fio_run $dev randread 4k 32 6 > /tmp/fio-$name.txt
  fio_run $dev read 128k 8 5 >> /tmp/fio-$name.txt
  [ "$(grep -c IOPS /tmp/fio-$name.txt)" = 2 ] || { cat /tmp/fio-$name.txt; fail "fio against $name"; }
  /usr/bin/nvme disconnect -n $nqn
  wait_for 10 sh -c "! ls $dev" || fail "$dev still present after disconnect"
  rdmablk bench -t rdma -a "$RDMA_IP" -s $port -n $nqn --rw randread --bs 4k --qd 32 --runtime 6s > /tmp/bench-$name.txt 2>/dev/null ||
    fail "rdmablk bench against $name"
  rdmablk bench -t rdma -a "$RDMA_IP" -s $port -n $nqn --rw randread --bs 4k --qd 32 --runtime 6s --busy-poll > /tmp/busy-$name.txt 2>/dev/null ||
    fail "rdmablk bench --busy-poll against $name"
done
while read -r l; do echo "COMPARE fio  rdmablk-target: $l"; done < /tmp/fio-ours.txt
while read -r l; do echo "COMPARE fio  nvmet-rdma:     $l"; done < /tmp/fio-theirs.txt
echo "COMPARE bench rdmablk-target: $(grep read: /tmp/bench-ours.txt)"
echo "COMPARE bench nvmet-rdma:     $(grep read: /tmp/bench-theirs.txt)"
echo "COMPARE bench --busy-poll rdmablk-target: $(grep read: /tmp/busy-ours.txt)"
echo "COMPARE bench --busy-poll nvmet-rdma:     $(grep read: /tmp/busy-theirs.txt)"
for f in bench-ours bench-theirs busy-ours busy-theirs; do echo "COMPARE cpu $f: $(grep 'run:' /tmp/$f.txt)"; done
stop_target
