# Linux NVMe/TCP host -> rdmablk-target: discover, connect (plain, with
# digests, and with SQ flow control disabled: reads then end with a C2HData
# carrying SUCCESS), block device of the right size, O_DIRECT
# write/read-back, ext4, disconnect; the daemon stays healthy and exits 0.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-kernel-host
truncate -s 256M /tmp/disk.img
start_target /tmp/target.log --listen tcp://127.0.0.1:4420 --file /tmp/disk.img --nqn $NQN
/usr/bin/nvme discover -t tcp -a 127.0.0.1 -s 4420 > /tmp/discover.log 2>&1 || fail "nvme discover"
grep -q "subnqn:  $NQN" /tmp/discover.log || fail "discovery log does not list $NQN"
say "nvme discover lists $NQN"
grep -qi "treq:.*sq flow control disable supported" /tmp/discover.log ||
  fail "discovery entry does not say SQ flow control disable is supported: $(grep treq /tmp/discover.log)"
for mode in plain digests sqflow; do
  extra=""; [ $mode = digests ] && extra="-g -G"; [ $mode = sqflow ] && extra="--disable-sqflow"
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN $extra || fail "nvme connect ($mode)"
  wait_for 20 nvme_blk $NQN || fail "no block device for $NQN ($mode)"
  dev=$(nvme_blk $NQN)
  size=$(blockdev --getsize64 "$dev")
  [ "$size" = 268435456 ] || fail "$dev has $size bytes, expected 268435456"
  say "$mode: $dev, $size bytes"
  if [ $mode = plain ]; then
    # Identify LPA bit 1 announces the Commands Supported and Effects log,
    # which lists Identify (admin 06h) among the commands supported.
    ctrl=/dev/$(basename "$dev" | sed 's/n[0-9]*$//')
    /usr/bin/nvme id-ctrl "$ctrl" | grep -E "^lpa +: 0x6$" > /dev/null ||
      fail "id-ctrl lpa: $(/usr/bin/nvme id-ctrl "$ctrl" | grep ^lpa)"
    /usr/bin/nvme effects-log "$ctrl" > /tmp/effects.log 2>&1 || fail "nvme effects-log: $(cat /tmp/effects.log)"
    grep -q "Identify" /tmp/effects.log || fail "effects log without Identify: $(head -20 /tmp/effects.log)"
    say "lpa 0x6; nvme effects-log: $(grep -c '^[AI]' /tmp/effects.log) command(s) listed"
  fi
  verify_blockdev "$dev" 16
  verify_ext4 "$dev"
  if [ $mode = sqflow ]; then
    grep -q "sq_flow_control=false" /tmp/target.log || fail "the kernel did not disable SQ flow control"
  fi
  /usr/bin/nvme disconnect -n $NQN || fail "nvme disconnect ($mode)"
  wait_for 10 sh -c "! ls /dev/$(basename $dev)" || fail "$dev still present after disconnect"
done
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
grep -E " (WARN|ERROR) " /tmp/target.log | head -5
say "kernel host over TCP: all checks passed"
