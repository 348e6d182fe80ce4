# Linux NVMe/TCP host -> rdmablk-target: discover, connect (plain, with
# digests, and with SQ flow control disabled: reads then end with a C2HData
# carrying SUCCESS), block device of the right size, O_DIRECT
# write/read-back, ext4, disconnect; the daemon stays healthy and exits 0.
# NVMe 2.0: the host reads VER 2.0, the NVM command set's limits (CNS 06h:
# its write-zeroes and discard limits follow them) and scans namespaces
# with CNS 08h; a namespace configured with uuid/nguid/eui64 shows exactly
# those in nvme ns-descs and nvme id-ns.
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
    # Identify LPA bits 1, 2 and 5 announce the Commands Supported and
    # Effects log (which lists Identify, admin 06h, among the commands
    # supported), extended data and the logs NVMe 2.0 makes mandatory.
    ctrl=/dev/$(basename "$dev" | sed 's/n[0-9]*$//')
    /usr/bin/nvme id-ctrl "$ctrl" > /tmp/id-ctrl.txt || fail "nvme id-ctrl"
    grep -E "^lpa +: 0x26$" /tmp/id-ctrl.txt > /dev/null || fail "id-ctrl lpa: $(grep ^lpa /tmp/id-ctrl.txt)"
    grep -E "^ver +: 0x20000$" /tmp/id-ctrl.txt > /dev/null || fail "id-ctrl ver: $(grep ^ver /tmp/id-ctrl.txt)"
    # nvme effects-log (nvme-cli 2.3) needs --csi here: without it, it
    # first reads CAP the way show-regs does, which fails on a fabrics
    # controller (show-regs does; get-property works).
    /usr/bin/nvme effects-log "$ctrl" --csi=0 > /tmp/effects.txt 2>&1 || fail "nvme effects-log: $(cat /tmp/effects.txt)"
    grep -Eq "^ACS6 +\[Identify +\] [0-9a-f]*[13579bdf]$" /tmp/effects.txt ||
      fail "effects log: Identify not supported: $(cat /tmp/effects.txt)"
    say "ver 2.0, lpa 0x26; nvme effects-log: $(grep -c '^ACS' /tmp/effects.txt) admin and $(grep -c '^IOCS' /tmp/effects.txt) I/O commands"
    # CNS 06h, and the host's queue limits from it (Linux: write zeroes
    # 4 KiB << WZSL, else MDTS; discard DMRSL blocks, 0 = UINT_MAX sectors;
    # DMRL ranges, 0 = 256).
    /usr/bin/nvme nvm-id-ctrl "$ctrl" > /tmp/nvm-id-ctrl.txt 2>&1 || fail "nvme nvm-id-ctrl: $(cat /tmp/nvm-id-ctrl.txt)"
    field() { awk -F: -v f="$1" '$1 ~ "^"f" *$" {gsub(/ /, "", $2); print $2}' /tmp/nvm-id-ctrl.txt; }
    wzsl=$(field wzsl); dmrl=$(field dmrl); dmrsl=$(field dmrsl)
    [ -n "$wzsl" ] && [ "$wzsl" != 0 ] || fail "nvm-id-ctrl wzsl: $(cat /tmp/nvm-id-ctrl.txt)"
    q=/sys/block/$(basename "$dev")/queue
    want=$((4096 << wzsl)); got=$(cat $q/write_zeroes_max_bytes)
    [ "$got" = "$want" ] || fail "write_zeroes_max_bytes $got, CNS 06h WZSL $wzsl says $want"
    want=$([ "$dmrsl" = 0 ] && echo $((4294967295 * 512)) || echo $((dmrsl * 512)))
    got=$(cat $q/discard_max_hw_bytes)
    [ "$got" = "$want" ] || fail "discard_max_hw_bytes $got, CNS 06h DMRSL $dmrsl says $want"
    want=$([ "$dmrl" = 0 ] && echo 256 || echo $dmrl); got=$(cat $q/max_discard_segments)
    [ "$got" = "$want" ] || fail "max_discard_segments $got, CNS 06h DMRL $dmrl says $want"
    say "CNS 06h wzsl $wzsl dmrl $dmrl dmrsl $dmrsl: write_zeroes_max_bytes $(cat $q/write_zeroes_max_bytes), discard_max_hw_bytes $(cat $q/discard_max_hw_bytes)"
  fi
  verify_blockdev "$dev" 16
  verify_ext4 "$dev"
  if [ $mode = sqflow ]; then
    grep -q "sq_flow_control=false" /tmp/target.log || fail "the kernel did not disable SQ flow control"
  fi
  disconnect_cleanly $NQN "$dev" "tcp $mode"
done
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
grep -E " (WARN|ERROR) " /tmp/target.log | head -5

# Identifiers given by the configuration, as a namespace moved here keeps them.
UUID=3a9f0c4e-1b2d-4c5e-8f70-0123456789ab NGUID=0123456789abcdef0011223344556677 EUI64=002538b571b12345
cat > /tmp/ids.toml <<TOML
[[listener]]
transport = "tcp"
address = "127.0.0.1:4420"
[[subsystem]]
nqn = "$NQN"
allow_any_host = true
  [[subsystem.namespace]]
  backend = "memory"
  size = "64MiB"
  uuid = "$UUID"
  nguid = "$NGUID"
  eui64 = "$EUI64"
TOML
start_target /tmp/target.log --config /tmp/ids.toml
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4420 -n $NQN || fail "nvme connect (identifiers)"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN (identifiers)"
dev=$(nvme_blk $NQN)
/usr/bin/nvme ns-descs "$dev" > /tmp/ns-descs.txt 2>&1 || fail "nvme ns-descs: $(cat /tmp/ns-descs.txt)"
for want in "uuid *: $UUID" "nguid *: $NGUID" "eui64 *: $EUI64"; do
  grep -Eq "^$want\$" /tmp/ns-descs.txt || fail "ns-descs lacks '$want': $(cat /tmp/ns-descs.txt)"
done
/usr/bin/nvme id-ns "$dev" > /tmp/id-ns.txt || fail "nvme id-ns"
grep -Eq "^nguid *: $NGUID$" /tmp/id-ns.txt || fail "id-ns nguid: $(grep -E '^(nguid|eui64)' /tmp/id-ns.txt)"
grep -Eq "^eui64 *: $EUI64$" /tmp/id-ns.txt || fail "id-ns eui64: $(grep -E '^(nguid|eui64)' /tmp/id-ns.txt)"
[ "$(cat /sys/block/$(basename $dev)/wwid)" = "uuid.$UUID" ] || fail "wwid $(cat /sys/block/$(basename $dev)/wwid)"
say "identifiers: ns-descs and id-ns show uuid $UUID, nguid $NGUID, eui64 $EUI64; wwid $(cat /sys/block/$(basename $dev)/wwid)"
/usr/bin/nvme disconnect -n $NQN || fail "nvme disconnect (identifiers)"
stop_target
say "kernel host over TCP: all checks passed"
