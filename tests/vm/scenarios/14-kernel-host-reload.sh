# Live reconfiguration under the Linux NVMe/TCP host, with fio verifying
# I/O on namespace 1 throughout (each 256 blocks written are read back and
# checked while the writes go on): `rdmablk-target reload` adds namespace 2
# (the kernel sees it through Namespace Attribute Changed: no reconnect, no
# ns-rescan), which takes writes that read back; removes it again; picks
# up namespace 1's grown backing file; and refuses a broken configuration,
# naming the key, while I/O goes on.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-reload
truncate -s 128M /tmp/ns1.img
truncate -s 64M /tmp/ns2.img
conf() { # NS2 POLLERS
  {
    [ -n "$2" ] && printf '[pollers]\ncount = %s\n\n' "$2"
    printf '[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:4440"\n\n'
    printf '[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n' "$NQN"
    printf '  [[subsystem.namespace]]\n  nsid = 1\n  backend = "file"\n  path = "/tmp/ns1.img"\n'
    [ "$1" = with2 ] && printf '  [[subsystem.namespace]]\n  nsid = 2\n  backend = "file"\n  path = "/tmp/ns2.img"\n'
  } > /tmp/reload.toml
}
reload() { rdmablk-target reload --control /tmp/control.sock > /tmp/reload.out 2> /tmp/reload.err; }
conf without2 ""
start_target /tmp/target.log --config /tmp/reload.toml --control /tmp/control.sock
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4440 -n $NQN > /dev/null || fail "nvme connect"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev1=$(nvme_blk $NQN)
dev2=${dev1%n1}n2
fio --name=bg --filename="$dev1" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k --iodepth=8 \
  --size=64M --time_based --runtime=20 --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
  --verify_backlog=256 \
  > /tmp/fio-bg.log 2>&1 &
FIO=$!

conf with2 ""
reload || fail "reload adding namespace 2: $(cat /tmp/reload.err)"
wait_for 5 test -b "$dev2" || fail "$dev2 did not appear within 5 s of the reload"
say "reload: $dev2 appeared ($(cat /tmp/reload.out))"
verify_blockdev "$dev2" 8

conf without2 ""
reload || fail "reload removing namespace 2: $(cat /tmp/reload.err)"
wait_for 5 sh -c "! test -b $dev2" || fail "$dev2 still present 5 s after its removal"
say "reload: $dev2 removed"

truncate -s 192M /tmp/ns1.img
reload || fail "reload after growing ns1.img: $(cat /tmp/reload.err)"
wait_for 5 sh -c "[ \$(blockdev --getsize64 $dev1) = 201326592 ]" ||
  fail "$dev1 is $(blockdev --getsize64 "$dev1") bytes after growing its file to 192 MiB"
say "reload: $dev1 grew to 192 MiB"

conf without2 3
reload && fail "a reload changing pollers.count succeeded"
grep -q "pollers.count" /tmp/reload.err || fail "the refusal does not name pollers.count: $(cat /tmp/reload.err)"
say "reload refused: $(cat /tmp/reload.err)"

wait $FIO || { cat /tmp/fio-bg.log; fail "fio on $dev1 failed during the reloads"; }
fio_verified /tmp/fio-bg.log
say "fio on $dev1: no error across the reloads; $FIO_VERIFIED"
/usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect"
stop_target
