# rdmablk host -> Linux nvmet-rdma over soft-RoCE: discover, bench --verify
# (4 KiB and 1 MiB), and an NBD export verified through the kernel's nbd client.
. /scenarios/lib.sh
rxe_up
NQN=nqn.2026-11.io.rdmablk:vm-nvmet-rdma
truncate -s 256M /tmp/nvmet-rdma.img
nvmet_rdma_export $NQN /tmp/nvmet-rdma.img 4431
T="-t rdma -a $RDMA_IP -s 4431"
rdmablk discover $T > /tmp/discover.log 2>&1 || fail "rdmablk discover -t rdma"
grep -q "subnqn:  $NQN" /tmp/discover.log || fail "rdmablk discover does not list $NQN"
say "rdmablk discover -t rdma lists $NQN"
rdmablk bench $T -n $NQN --rw randrw --bs 4k --qd 32 --runtime 3s --verify > /tmp/bench.log 2>&1 || fail "rdmablk bench --verify 4k against nvmet-rdma"
tail -3 /tmp/bench.log
rdmablk bench $T -n $NQN --rw write --bs 1m --qd 8 --runtime 3s --verify > /tmp/bench2.log 2>&1 || fail "rdmablk bench --verify 1 MiB against nvmet-rdma"
tail -3 /tmp/bench2.log
/usr/bin/modprobe nbd || fail "modprobe nbd"
: > /tmp/connect.out  # no earlier scenario's "ready: " for the wait to find
rdmablk connect $T -n $NQN --nbd unix:/tmp/nvmet-rdma.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect -t rdma did not become ready"
/usr/bin/nbd-client -unix /tmp/nvmet-rdma.sock /dev/nbd0 -b 4096 || fail "nbd-client"
verify_blockdev /dev/nbd0 16
/usr/bin/nbd-client -d /dev/nbd0
kill -TERM $CPID; wait $CPID || fail "rdmablk connect exited non-zero"
say "rdmablk host against nvmet-rdma: all checks passed"
