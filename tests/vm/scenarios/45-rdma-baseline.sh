# Soft-RoCE baseline, kernel on both ends: nvmet-rdma export attached with
# nvme connect -t rdma over rxe0 and verified; then perftest ceilings
# (ib_write_bw, ib_read_bw) between two processes over rxe0.
. /scenarios/lib.sh
rxe_up
say "rxe0 on eth0, RDMA_IP $RDMA_IP, GID index $RDMA_GID_INDEX"
/usr/bin/rdma link show rxe0/1 || fail "rdma link show rxe0"

/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
NQN=nqn.2026-11.io.rdmablk:vm-rdma-baseline
PORT=4430
truncate -s 256M /tmp/rdma-base.img
nvmet_rdma_export $NQN /tmp/rdma-base.img $PORT
/usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s $PORT -n $NQN > /tmp/connect.log 2>&1 || fail "nvme connect -t rdma"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev=$(nvme_blk $NQN)
trt=$(for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn" 2>/dev/null)" = $NQN ] && cat "$c/transport"; done)
[ "$trt" = rdma ] || fail "$dev: transport '$trt', expected rdma"
size=$(blockdev --getsize64 "$dev")
[ "$size" = 268435456 ] || fail "$dev has $size bytes, expected 268435456"
say "nvme-rdma: $dev, $size bytes"
verify_blockdev "$dev" 16
/usr/bin/nvme disconnect -n $NQN || fail "nvme disconnect"
wait_for 10 sh -c "! ls $dev" || fail "$dev still present after disconnect"

# ceiling NAME: perftest NAME, server in the background and client to
# $RDMA_IP, 64 KiB messages. Its clock comes from a TSC-vs-time regression
# that TCG jitter can spoil ("Correlation coefficient" warning, figures of
# 0): such a run is repeated, twice at most, then reported as invalid.
ceiling() {
  for attempt in 1 2 3; do
    # 18515 (0x4853) is perftest's port; the client needs the server listening.
    timeout 120 "/usr/bin/$1" -d rxe0 -x "$RDMA_GID_INDEX" -s 65536 -n 1000 -F > "/tmp/$1.srv" 2>&1 &
    spid=$!
    wait_for 20 grep -q ':4853 00000000:0000 0A' /proc/net/tcp /proc/net/tcp6 || { kill $spid; fail "$1 server did not listen"; }
    timeout 120 "/usr/bin/$1" -d rxe0 -x "$RDMA_GID_INDEX" -s 65536 -n 1000 -F "$RDMA_IP" > "/tmp/$1.cli" 2>&1; rc=$?
    wait $spid; src=$?
    [ $rc -eq 0 ] && [ $src -eq 0 ] || { cat "/tmp/$1.srv" "/tmp/$1.cli"; fail "$1: client exit $rc, server exit $src"; }
    grep -q 'Correlation coefficient' "/tmp/$1.cli" || break
    say "$1: perftest clock calibration failed (attempt $attempt)"
  done
  # #bytes #iterations BW-peak BW-average MsgRate; MB/sec is 2^20 bytes/s.
  bw=$(awk '$1 == 65536 && NF >= 5 {v = $4} END {print v}' "/tmp/$1.cli")
  [ -n "$bw" ] || { cat "/tmp/$1.cli"; fail "$1: no result line"; }
  note=""
  grep -q 'Correlation coefficient' "/tmp/$1.cli" && note=" (perftest clock calibration failed: figures invalid)"
  echo "ceiling: $1 64KiB: $bw MiB/s$note"
}
ceiling ib_write_bw
ceiling ib_read_bw
say "soft-RoCE baseline: all checks passed"
