# Two gateways over NVMe/RDMA (soft-RoCE), the Linux host's native
# multipath: gateway A (optimized) and B (non-optimized) export one backing
# file under one NQN; fio writes and verifies while A is killed (SIGKILL)
# and restarted 10 s later. No I/O error; every block verifies.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
ANA_NQN=nqn.2026-11.io.rdmablk:vm-ana-rdma
truncate -s 64M /tmp/ana.img
A=4433; B=4434
gw_conf a "rdma://$RDMA_IP:$A" optimized 1 100
gw_conf b "rdma://$RDMA_IP:$B" non-optimized 101 200
gw_start a; gw_start b
for p in $A $B; do
  /usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s $p -n $ANA_NQN --reconnect-delay=1 --ctrl-loss-tmo=60 \
    > /dev/null || fail "nvme connect -t rdma to port $p"
done
wait_for 20 nvme_blk $ANA_NQN || fail "no block device for $ANA_NQN"
dev=$(nvme_blk $ANA_NQN)
gw_wait 10 $A "live optimized" "connected over RDMA"
gw_wait 10 $B "live non-optimized" "connected over RDMA"

fio_passes "$dev"
fio_more 1 "both gateways up"
gw_kill_and_restart_a $A
fio_stop

/usr/bin/nvme disconnect -n $ANA_NQN > /dev/null || fail "nvme disconnect"
for g in a b; do TARGET_PID=$(eval echo "\$GW_PID_$g"); stop_target; done
say "two gateways, ANA, kernel multipath over RDMA: all checks passed"
