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
    # (nvme-cli 2.4's effects-log reads CAP by passthrough, which a
    # fabrics controller does not take: the log is read as it is.)
    /usr/bin/nvme get-log "$ctrl" --log-id=5 --log-len=4096 -b > /tmp/effects.bin 2> /tmp/effects.err ||
      fail "nvme get-log 05h: $(cat /tmp/effects.err)"
    # Admin opcode 06h's entry: its dword at byte 24, bit 0 (CSUPP).
    csupp=$(od -An -tu4 -j24 -N4 /tmp/effects.bin | tr -d ' ')
    [ -n "$csupp" ] && [ $((csupp & 1)) = 1 ] ||
      fail "effects log ($(stat -c %s /tmp/effects.bin) bytes): Identify not supported ($csupp)"
    say "lpa 0x6; effects log: Identify supported ($(stat -c %s /tmp/effects.bin) bytes)"
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
