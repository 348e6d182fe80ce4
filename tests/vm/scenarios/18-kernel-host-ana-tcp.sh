# Two gateways, one namespace, the Linux host's native multipath over
# NVMe/TCP: two rdmablk-target processes export one backing file under one
# NQN (disjoint controller ids), gateway A optimized, B non-optimized. The
# kernel makes one block device with two paths whose ANA states follow the
# gateways, while fio writes and verifies throughout: A killed (SIGKILL)
# and restarted 10 s later, the states swapped by reload, A set
# inaccessible by `rdmablk-target ana set`, then persistent loss. fio never
# sees an I/O error and every block verifies.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || fail "the kernel's native multipath is off"
ANA_NQN=nqn.2026-11.io.rdmablk:vm-ana
truncate -s 64M /tmp/ana.img
A=4431; B=4432
gw_conf a tcp://127.0.0.1:$A optimized 1 100
gw_conf b tcp://127.0.0.1:$B non-optimized 101 200
gw_start a; gw_start b
for p in $A $B; do
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $p -n $ANA_NQN --reconnect-delay=1 --ctrl-loss-tmo=60 \
    > /dev/null || fail "nvme connect to port $p"
done
wait_for 20 nvme_blk $ANA_NQN || fail "no block device for $ANA_NQN"
dev=$(nvme_blk $ANA_NQN)
[ "$(ls -d /sys/block/nvme*c*n1 | wc -l)" = 2 ] || fail "not two paths: $(ls /sys/block)"
gw_wait 10 $A "live optimized" "connected"
gw_wait 10 $B "live non-optimized" "connected"
/usr/bin/nvme list-subsys "$dev" > /tmp/list-subsys.out 2>&1 || fail "nvme list-subsys: $(cat /tmp/list-subsys.out)"
grep -q "trsvcid=$A.* optimized" /tmp/list-subsys.out && grep -q "trsvcid=$B.* non-optimized" /tmp/list-subsys.out ||
  fail "nvme list-subsys does not show the ANA states: $(cat /tmp/list-subsys.out)"
say "$dev: two paths; nvme list-subsys:"; cat /tmp/list-subsys.out

fio_passes "$dev"
fio_more 1 "both gateways up"

gw_kill_and_restart_a $A

gw_conf a tcp://127.0.0.1:$A non-optimized 1 100
gw_conf b tcp://127.0.0.1:$B optimized 101 200
rdmablk-target reload --control /tmp/gw-a.sock > /tmp/reload.out 2>&1 || fail "reload A: $(cat /tmp/reload.out)"
grep -q "ANA group 1 non-optimized on tcp://127.0.0.1:$A" /tmp/reload.out || fail "reload A says: $(cat /tmp/reload.out)"
rdmablk-target reload --control /tmp/gw-b.sock > /tmp/reload.out 2>&1 || fail "reload B: $(cat /tmp/reload.out)"
gw_wait 10 $A "live non-optimized" "states swapped by reload (within ANATT)"
gw_wait 10 $B "live optimized" "states swapped by reload (within ANATT)"
fio_more 1 "B preferred"

gw_conf a tcp://127.0.0.1:$A optimized 1 100
gw_conf b tcp://127.0.0.1:$B non-optimized 101 200
rdmablk-target reload --control /tmp/gw-a.sock > /dev/null 2>&1 || fail "reload A back"
rdmablk-target reload --control /tmp/gw-b.sock > /dev/null 2>&1 || fail "reload B back"
gw_wait 10 $A "live optimized" "swapped back"
fio_more 1 "A preferred again"

rdmablk-target ana set 1 inaccessible --listener 127.0.0.1:$A --control /tmp/gw-a.sock > /tmp/ana.out 2>&1 ||
  fail "ana set inaccessible: $(cat /tmp/ana.out)"
gw_wait 10 $A "live inaccessible" "ana set 1 inaccessible on A"
rdmablk-target status --control /tmp/gw-a.sock > /tmp/status.out 2>&1 || fail "status: $(cat /tmp/status.out)"
grep -q "ANA groups on tcp://127.0.0.1:$A: 1 inaccessible" /tmp/status.out || fail "status does not show it: $(cat /tmp/status.out)"
fio_more 1 "A inaccessible, I/O on B"

rdmablk-target ana set 1 persistent-loss --control /tmp/gw-a.sock > /tmp/ana.out 2>&1 ||
  fail "ana set persistent-loss: $(cat /tmp/ana.out)"
gw_wait 10 $A "live persistent-loss" "ana set 1 persistent-loss on A"
fio_more 1 "A in persistent loss, I/O on B"

rdmablk-target reload --control /tmp/gw-a.sock > /tmp/reload.out 2>&1 || fail "reload A: $(cat /tmp/reload.out)"
gw_wait 10 $A "live optimized" "a reload applies the file again"
fio_more 1 "A optimized again"
fio_stop

/usr/bin/nvme disconnect -n $ANA_NQN > /dev/null || fail "nvme disconnect"
for g in a b; do TARGET_PID=$(eval echo "\$GW_PID_$g"); stop_target; done
grep -E " (WARN|ERROR) " /tmp/gw-a.log /tmp/gw-b.log | head -5
say "two gateways, ANA, kernel multipath over TCP: all checks passed"
