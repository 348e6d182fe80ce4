# rdmablk bench over two paths to Linux nvmet (NVMe/TCP), one subsystem on
# two ports whose ANA states are set through configfs: the states are
# swapped during a verified run, then the optimized port is made
# inaccessible; the run ends with 0 errors and 0 verify mismatches, and
# the host's log shows it followed the states.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-nvmet-ana
truncate -s 64M /tmp/nvmet-ana.img
nvmet_tcp_export $NQN /tmp/nvmet-ana.img 4456
n=/sys/kernel/config/nvmet
p=$n/ports/4457; mkdir -p "$p"
echo tcp > "$p/addr_trtype"; echo ipv4 > "$p/addr_adrfam"
echo 127.0.0.1 > "$p/addr_traddr"; echo 4457 > "$p/addr_trsvcid"
ln -s "$n/subsystems/$NQN" "$p/subsystems/$NQN" || fail "nvmet second port"
ana() { echo "$2" > "$n/ports/$1/ana_groups/1/ana_state" || fail "nvmet ana_state $2 on port $1"; }
ana 4456 optimized; ana 4457 non-optimized
RUST_LOG=rdmablk=info rdmablk bench -t tcp -a 127.0.0.1 -s 4456 -n $NQN --path tcp://127.0.0.1:4457 \
  --rw randrw --bs 4k --qd 16 --runtime 12s --verify > /tmp/bench.out 2> /tmp/bench.log &
BENCH=$!
sleep 3
ana 4456 non-optimized; ana 4457 optimized
say "nvmet: states swapped (4457 optimized)"
sleep 3
ana 4456 optimized; ana 4457 inaccessible
say "nvmet: 4457 inaccessible, 4456 optimized"
sleep 3
ana 4456 optimized; ana 4457 non-optimized
wait $BENCH || { cat /tmp/bench.out; tail -20 /tmp/bench.log; fail "rdmablk bench over two nvmet paths failed"; }
cat /tmp/bench.out
grep -q "verify errors: 0" /tmp/bench.out || fail "verify errors"
grep "ANA state" /tmp/bench.log | head -6
grep -q "ANA state non-optimized -> optimized path=127.0.0.1:4457" /tmp/bench.log || fail "the host did not follow the swap"
grep -q "ANA state optimized -> inaccessible path=127.0.0.1:4457" /tmp/bench.log || fail "the host did not see 4457 inaccessible"
grep -q "ANA Change notice path=127.0.0.1:4457" /tmp/bench.log || fail "no ANA Change notice from nvmet reached the host"
say "bench --verify over two nvmet paths across ANA changes: all checks passed"
