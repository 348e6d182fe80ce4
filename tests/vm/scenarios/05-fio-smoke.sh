# fio from the tools disk (/usr/bin/fio runs /opt/tools/bin/fio): O_DIRECT
# random writes verified with crc32c on a loop device, with io_uring and
# libaio; a corrupted block must then fail verification.
. /scenarios/lib.sh
/usr/bin/fio --version > /tmp/fio-version.log 2>&1 || fail "fio does not run"
say "$(cat /tmp/fio-version.log) from the tools disk"
/usr/bin/modprobe loop || fail "modprobe loop"
truncate -s 64M /tmp/fio-backing.img
dev=$(losetup -f) || fail "no free loop device"
losetup "$dev" /tmp/fio-backing.img || fail "losetup $dev"

# fio_job ENGINE [ARGS...]: the same job every time (same offsets and data).
# Every 4 KiB block of 16 MiB is written once, then read back and verified.
fio_job() {
  e=$1; shift
  /usr/bin/fio --name=smoke --filename="$dev" --ioengine="$e" --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --size=16M --verify=crc32c --verify_fatal=1 --verify_state_save=0 "$@"
}
for e in io_uring libaio; do
  fio_job $e > /tmp/fio-$e.log 2>&1 || fail "fio $e exited with $?"
  grep -qi verify /tmp/fio-$e.log && fail "fio $e reported verify errors"
  rw=$(sed -n 's/.*issued rwts: total=\([0-9]*\),\([0-9]*\),.*/\1 \2/p' /tmp/fio-$e.log)
  [ "$rw" = "4096 4096" ] || fail "fio $e: expected 4096 writes and 4096 verify reads, got '$rw'"
  say "fio $e: $(grep -o 'write: IOPS=[^,]*' /tmp/fio-$e.log), 16 MiB written and verified"
done

# The check is real: 8 overwritten blocks fail a verify-only pass.
dd if=/dev/urandom of="$dev" bs=4k seek=100 count=8 oflag=direct conv=notrunc 2>/dev/null || fail "dd to $dev"
fio_job io_uring --verify_only > /tmp/fio-corrupt.log 2>&1 && fail "fio verified a corrupted device"
grep -q "verify: bad" /tmp/fio-corrupt.log || fail "fio failed on the corrupted device, but not in verification"
say "fio: corrupted blocks detected ($(grep -m1 -o 'verify: bad[^,]*' /tmp/fio-corrupt.log))"

losetup -d "$dev"
rm -f /tmp/fio-backing.img /tmp/fio-*.log
say "fio smoke test: all checks passed"
