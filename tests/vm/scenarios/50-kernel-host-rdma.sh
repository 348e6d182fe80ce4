# Linux NVMe/RDMA host -> rdmablk-target over soft-RoCE: discover (the
# wildcard listener is reported at the address the host reached), connect,
# block device of the right size, O_DIRECT write/read-back, ext4 with files
# across a remount, disconnect; the daemon stays healthy and exits 0.
. /scenarios/lib.sh
rxe_up
/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
NQN=nqn.2026-11.io.rdmablk:vm-kernel-host-rdma
truncate -s 256M /tmp/rdisk.img
start_target /tmp/target.log --listen "rdma://0.0.0.0:4420" --file /tmp/rdisk.img --nqn $NQN
/usr/bin/nvme discover -t rdma -a "$RDMA_IP" -s 4420 > /tmp/discover.log 2>&1 || fail "nvme discover -t rdma"
grep -q "subnqn:  $NQN" /tmp/discover.log || fail "discovery log does not list $NQN"
grep -q "trtype:  rdma" /tmp/discover.log || fail "discovery log entry is not rdma"
grep -Eq "traddr: +$RDMA_IP *$" /tmp/discover.log ||
  fail "the wildcard listener is not reported at $RDMA_IP: $(grep traddr /tmp/discover.log)"
say "nvme discover -t rdma lists $NQN"
/usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s 4420 -n $NQN || fail "nvme connect -t rdma"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev=$(nvme_blk $NQN)
size=$(blockdev --getsize64 "$dev")
[ "$size" = 268435456 ] || fail "$dev has $size bytes, expected 268435456"
say "rdma: $dev, $size bytes"
verify_blockdev "$dev" 16
verify_ext4 "$dev"
disconnect_cleanly $NQN "$dev" rdma
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
grep -E " (WARN|ERROR) " /tmp/target.log | head -5
say "kernel host over RDMA: all checks passed"
