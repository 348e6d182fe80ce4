# Over soft-RoCE, in one boot: the same fio load (4 KiB random read QD 32,
# 128 KiB sequential read QD 8; O_DIRECT, io_uring) on /dev/nvmeXnY from
# rdmablk-target and from Linux nvmet-rdma (both backed by a file on tmpfs),
# and `rdmablk bench` against both (sleeping and busy polling): each load
# runs and moves data on both. The figures (with perftest's ib_write_bw /
# ib_read_bw as the ceiling, in 45-rdma-baseline) are bench/vm.sh's: it boots
# with VM_MEASURE=1 for loads of 5-6 s; here they run 1 s.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
truncate -s 256M /tmp/ours-rdma.img /tmp/theirs-rdma.img
OURS=nqn.2026-11.io.rdmablk:vm-ours-rdma
THEIRS=nqn.2026-11.io.rdmablk:vm-theirs-rdma
start_target /tmp/target.log --listen "rdma://$RDMA_IP:4450" --file /tmp/ours-rdma.img --nqn $OURS
nvmet_rdma_export $THEIRS /tmp/theirs-rdma.img 4451

sides="rdmablk-target nvmet-rdma"
for side in rdmablk-target:4450:$OURS nvmet-rdma:4451:$THEIRS; do
  name=${side%%:*}; rest=${side#*:}; port=${rest%%:*}; nqn=${rest#*:}
  /usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s $port -n $nqn -i 1 || fail "connect $name"
  wait_for 20 nvme_blk $nqn || fail "no block device for $name"
  dev=$(nvme_blk $nqn)
  dd if=/dev/zero of=$dev bs=1M count="$(suite_or_bench 8 64)" oflag=direct 2>/dev/null
  fio_run $dev randread 4k 32 "$(suite_or_bench 1 6)" > /tmp/fio-rand-$name.txt
  fio_run $dev read 128k 8 "$(suite_or_bench 1 5)" > /tmp/fio-seq-$name.txt
  /usr/bin/nvme disconnect -n $nqn
  wait_for 10 sh -c "! ls $dev" || fail "$dev still present after disconnect"
  for mode in sleep busy-poll; do
    flag=""; [ $mode = busy-poll ] && flag=--busy-poll
    rdmablk bench -t rdma -a "$RDMA_IP" -s $port -n $nqn --rw randread --bs 4k --qd 32 \
      --runtime "$(suite_or_bench 1 6)s" $flag > /tmp/bench.txt 2>/dev/null || fail "rdmablk bench $flag against $name"
    grep read: /tmp/bench.txt > /tmp/bench-$mode-$name.txt
    grep 'run:' /tmp/bench.txt > /tmp/cpu-$mode-$name.txt
  done
done
for load in fio-rand fio-seq bench-sleep bench-busy-poll cpu-sleep cpu-busy-poll; do
  for name in $sides; do compare rdma-$load $name /tmp/$load-$name.txt; done
done
stop_target
