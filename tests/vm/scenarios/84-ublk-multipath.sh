# rdmablk's own multipath under /dev/ublkbN: one path over NVMe/TCP to
# gateway A (ANA optimized), one over NVMe/RDMA (soft-RoCE) to gateway B
# (non-optimized), both exporting one backing file under one NQN. fio
# writes and verifies throughout while A is killed with SIGKILL and
# restarted 10 s later: I/O moves to B without an error and back to A.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe ublk_drv || fail "modprobe ublk_drv"
ANA_NQN=nqn.2026-11.io.rdmablk:vm-ublk-multipath
truncate -s 64M /tmp/ana.img
gw_conf a "tcp://$RDMA_IP:4441" optimized 1 100
gw_conf b "rdma://$RDMA_IP:4442" non-optimized 101 200
gw_start a; gw_start b
ublk_up /tmp/ublk-mp.log -t tcp -a "$RDMA_IP" -s 4441 -n $ANA_NQN --path "rdma://$RDMA_IP:4442" -l 60
grep -q "ANA state optimized -> non-optimized path=$RDMA_IP:4442" /tmp/ublk-mp.log ||
  fail "the host did not read B's ANA state: $(grep ANA /tmp/ublk-mp.log)"
fio_passes "$UBLK_DEV"
fio_more 1 "both gateways up"
kill -KILL "$GW_PID_a"; wait "$GW_PID_a" 2>/dev/null
say "gateway A killed"
wait_for 10 grep -q "association lost" /tmp/ublk-mp.log || fail "the host did not notice A's death"
fio_more 1 "A dead, I/O on B over RDMA"
sleep 10
mv /tmp/gw-a.log /tmp/gw-a-first.log
gw_start a
wait_for 30 grep -q "association re-established" /tmp/ublk-mp.log || fail "the host did not reconnect to A"
fio_more 1 "A back"
fio_stop
grep -E "sent again on another path|association|ANA state" /tmp/ublk-mp.log | head -8
ublk_down
for g in a b; do TARGET_PID=$(eval echo "\$GW_PID_$g"); stop_target; done
say "ublk over TCP and RDMA paths to two gateways: all checks passed"
