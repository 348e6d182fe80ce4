# The same fio load (io_uring, O_DIRECT: 4 KiB random read QD 32, 128 KiB
# sequential read QD 8) in one boot against rdmablk-target over NVMe/TCP
# through three front-ends: /dev/ublkb0 (rdmablk connect --ublk), /dev/nbd0
# (the kernel's nbd-client on rdmablk connect --nbd) and /dev/nvmeXnY (the
# kernel's NVMe/TCP host). Prints COMPARE lines; TCG figures are ratios only.
. /scenarios/lib.sh
/usr/bin/modprobe ublk_drv || fail "modprobe ublk_drv"
/usr/bin/modprobe nbd || fail "modprobe nbd"
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-fronts
truncate -s 256M /tmp/fronts.img
start_target /tmp/target.log --listen tcp://127.0.0.1:4470 --file /tmp/fronts.img --nqn $NQN
T="-t tcp -a 127.0.0.1 -s 4470 -n $NQN"
dd if=/dev/urandom of=/tmp/fill bs=1M count=64 2>/dev/null

measure() { # NAME DEV
  dd if=/tmp/fill of="$2" bs=1M oflag=direct 2>/dev/null || fail "filling $2"
  fio_run "$2" randread 4k 32 6 > "/tmp/fio-$1.txt"
  fio_run "$2" read 128k 8 5 >> "/tmp/fio-$1.txt"
  [ "$(grep -c IOPS "/tmp/fio-$1.txt")" = 2 ] || { cat "/tmp/fio-$1.txt"; fail "fio on $1"; }
}

ublk_up /tmp/ublk.log $T --ublk-id 0
measure ublk $UBLK_DEV
ublk_down

: > /tmp/connect.out  # no earlier scenario's "ready: " for the wait to find
rdmablk connect $T --nbd unix:/tmp/fronts.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect --nbd did not become ready"
/usr/bin/nbd-client -unix /tmp/fronts.sock /dev/nbd0 -b 4096 > /dev/null || fail "nbd-client"
measure nbd /dev/nbd0
/usr/bin/nbd-client -d /dev/nbd0 > /dev/null
kill -TERM $CPID; wait $CPID || fail "rdmablk connect --nbd exited non-zero"

/usr/bin/nvme connect $T -i 1 > /dev/null || fail "nvme connect"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev=$(nvme_blk $NQN)
measure nvme $dev
/usr/bin/nvme disconnect -n $NQN > /dev/null

for f in ublk nbd nvme; do
  while read -r l; do printf 'COMPARE %-5s %s\n' "$f" "$l"; done < /tmp/fio-$f.txt
done
stop_target
