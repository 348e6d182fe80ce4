# The same fio load (io_uring, O_DIRECT: 4 KiB random read QD 32, 128 KiB
# sequential read QD 8) in one boot against rdmablk-target over NVMe/TCP
# through three front-ends: /dev/ublkbN (rdmablk connect --ublk), /dev/nbd0
# (the kernel's nbd-client on rdmablk connect --nbd) and /dev/nvmeXnY (the
# kernel's NVMe/TCP host). Twice: with both sides polling adaptively (the
# defaults) and with both sleeping whenever idle (`spin_max = 0`,
# `--spin-max 0`: how they waited before adaptive polling). Each load runs
# and moves data through every front-end in both modes. The figures are
# bench/vm.sh's (it boots with VM_MEASURE=1 for loads of 6 and 5 s; here
# they run 1 s).
. /scenarios/lib.sh
/usr/bin/modprobe ublk_drv || fail "modprobe ublk_drv"
/usr/bin/modprobe nbd || fail "modprobe nbd"
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-fronts
truncate -s 256M /tmp/fronts.img
T="-t tcp -a 127.0.0.1 -s 4470 -n $NQN"
dd if=/dev/urandom of=/tmp/fill bs=1M count="$(suite_or_bench 8 64)" 2>/dev/null

measure() { # NAME DEV
  dd if=/tmp/fill of="$2" bs=1M oflag=direct 2>/dev/null || fail "filling $2"
  fio_run "$2" randread 4k 32 "$(suite_or_bench 1 6)" > "/tmp/fio-rand-$1.txt"
  fio_run "$2" read 128k 8 "$(suite_or_bench 1 5)" > "/tmp/fio-seq-$1.txt"
}

# pass MODE SPIN_MAX: every front-end against a target whose pollers and
# whose host engines spin at most SPIN_MAX.
pass() {
  mode=$1
  printf '[pollers]\nspin_max = "%s"\n\n[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:4470"\n\n[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n\n[[subsystem.namespace]]\nbackend = "file"\npath = "/tmp/fronts.img"\n' \
    "$2" "$NQN" > /tmp/fronts.toml
  start_target /tmp/target.log --config /tmp/fronts.toml
  ublk_up /tmp/ublk.log $T --ublk-id 0 --spin-max "$2"
  measure "ublk-$mode" $UBLK_DEV
  ublk_down

  : > /tmp/connect.out  # no earlier run's "ready: " for the wait to find
  rdmablk connect $T --nbd unix:/tmp/fronts.sock --spin-max "$2" > /tmp/connect.out 2> /tmp/connect.log &
  CPID=$!
  wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect --nbd did not become ready"
  /usr/bin/nbd-client -unix /tmp/fronts.sock /dev/nbd0 -b 4096 > /dev/null || fail "nbd-client"
  measure "nbd-$mode" /dev/nbd0
  /usr/bin/nbd-client -d /dev/nbd0 > /dev/null
  kill -TERM $CPID; wait $CPID || fail "rdmablk connect --nbd exited non-zero"

  /usr/bin/nvme connect $T -i 1 > /dev/null || fail "nvme connect"
  wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
  dev=$(nvme_blk $NQN)
  measure "nvme-$mode" $dev
  /usr/bin/nvme disconnect -n $NQN > /dev/null
  stop_target
}

pass adaptive 100us
pass sleep 0

for f in ublk nbd nvme; do
  for load in rand seq; do
    for mode in adaptive sleep; do compare "$f-$load" $mode "/tmp/fio-$load-$f-$mode.txt"; done
  done
done
