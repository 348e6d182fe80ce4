# rdmablk host -> Linux nvmet-tcp: discover, bench --verify, and an NBD
# export verified through the kernel's nbd client.
. /scenarios/lib.sh
NQN=nqn.2026-11.io.rdmablk:vm-nvmet
truncate -s 256M /tmp/nvmet.img
nvmet_tcp_export $NQN /tmp/nvmet.img 4421
rdmablk discover -t tcp -a 127.0.0.1 -s 4421 > /tmp/discover.log 2>&1 || fail "rdmablk discover"
grep -q "subnqn:  $NQN" /tmp/discover.log || fail "rdmablk discover does not list $NQN"
say "rdmablk discover lists $NQN"
rdmablk bench -t tcp -a 127.0.0.1 -s 4421 -n $NQN --rw randrw --bs 4k --qd 16 --runtime 3s --verify > /tmp/bench.log 2>&1 || fail "rdmablk bench --verify against nvmet"
cat /tmp/bench.log | tail -3
rdmablk bench -t tcp -a 127.0.0.1 -s 4421 -n $NQN --rw write --bs 1m --qd 4 --runtime 2s --verify > /tmp/bench2.log 2>&1 || fail "rdmablk bench --verify 1 MiB against nvmet"
/usr/bin/modprobe nbd || fail "modprobe nbd"
: > /tmp/connect.out  # no earlier scenario's "ready: " for the wait to find
rdmablk connect -t tcp -a 127.0.0.1 -s 4421 -n $NQN --nbd unix:/tmp/nvmet.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect did not become ready"
/usr/bin/nbd-client -unix /tmp/nvmet.sock /dev/nbd0 -b 4096 || fail "nbd-client"
verify_blockdev /dev/nbd0 16
/usr/bin/nbd-client -d /dev/nbd0
kill -TERM $CPID; wait $CPID || fail "rdmablk connect exited non-zero"
say "rdmablk host against nvmet-tcp: all checks passed"
