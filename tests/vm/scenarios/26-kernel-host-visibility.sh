# Per-host namespace visibility with the Linux NVMe/TCP host: two host
# identities (host NQN and host ID) connect from one kernel to one subsystem
# with three file namespaces: 1 seen by both, 2 by A only, 3 by B only. Each
# controller's Identify active namespace list (nvme list-ns through its
# character device) and its namespace paths in sysfs (nvmeYcZnN under
# /sys/class/nvme/nvmeX, one per namespace the kernel attached through that
# controller) show exactly what its host may see, and Identify Namespace of
# B's namespace through A is all zeroes (inactive). (I/O from A to a
# namespace it does not see cannot be sent from here: the kernel refuses
# passthrough I/O whose NSID is not that of the namespace it goes to.) Then,
# with fio verifying writes to the shared namespace 1 throughout,
# `rdmablk-target reload` moves namespace 2 from A to B: Namespace Attribute
# Changed must reach both controllers, and the kernel's rescan must drop A's
# path and add B's within 10 s, with no reconnect. Namespace 2 keeps its
# data across the move (written through A, read back through B) and takes
# writes through B. The kernel's device changes during the move are printed,
# timed: it drops the old multipath head with A's path, its last, and makes
# a new head (another nvmeYnN) for B's.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-tenants
# A listener per host: nvme-cli 2.3 takes a second host NQN to an address
# and subsystem it is connected to for that connection ("already connected").
PORT_A=4446
PORT_B=4447
HID_A=3a7d1e2f-5b6c-4d8e-9f01-a2b3c4d5e6a1
HID_B=8c2b4e6f-1a3d-4b5c-8e7f-9a0b1c2d3eb2
HNQN_A=nqn.2014-08.org.nvmexpress:uuid:$HID_A
HNQN_B=nqn.2014-08.org.nvmexpress:uuid:$HID_B
cleanup() {
  [ -f /tmp/watch.pid ] && kill "$(cat /tmp/watch.pid)" 2>/dev/null
  /usr/bin/nvme disconnect -n $NQN > /dev/null 2>&1
  [ -n "${TARGET_PID:-}" ] && kill -KILL "$TARGET_PID" 2>/dev/null
}
trap cleanup EXIT

truncate -s 128M /tmp/tenant-ns1.img
truncate -s 64M /tmp/tenant-ns2.img
truncate -s 64M /tmp/tenant-ns3.img
# conf NS2_HOST: the configuration, namespace 2 seen by host NS2_HOST (A or B).
conf() {
  eval "ns2=\$HNQN_$1"
  cat > /tmp/tenants.toml <<EOF
[[listener]]
transport = "tcp"
address = "127.0.0.1:$PORT_A"

[[listener]]
transport = "tcp"
address = "127.0.0.1:$PORT_B"

[[subsystem]]
nqn = "$NQN"
allow_any_host = false
hosts = ["$HNQN_A", "$HNQN_B"]

    [[subsystem.namespace]]
    nsid = 1
    backend = "file"
    path = "/tmp/tenant-ns1.img"

    [[subsystem.namespace]]
    nsid = 2
    backend = "file"
    path = "/tmp/tenant-ns2.img"
    hosts = ["$ns2"]

    [[subsystem.namespace]]
    nsid = 3
    backend = "file"
    path = "/tmp/tenant-ns3.img"
    hosts = ["$HNQN_B"]
EOF
}
reload() { rdmablk-target reload --control /tmp/control.sock > /tmp/reload.out 2> /tmp/reload.err; }
conf A
start_target /tmp/target.log --config /tmp/tenants.toml --control /tmp/control.sock

# ---------------------------------------------------------------- helpers
# ctrl_of HOSTNQN: the controller (nvmeX) of $NQN that host connected.
ctrl_of() {
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/subsysnqn 2>/dev/null)" = $NQN ] && [ "$(cat $c/hostnqn 2>/dev/null)" = "$1" ] &&
      { echo ${c##*/}; return 0; }
  done
  return 1
}
is_live() { [ "$(cat /sys/class/nvme/$1/state 2>/dev/null)" = live ]; }
# listed CTRL: the namespace IDs in CTRL's Identify active namespace list
# (nvme list-ns prints "[   i]:0xNSID"), ascending, on one line; the raw
# output stays in /tmp/listns.CTRL.
listed() {
  /usr/bin/nvme list-ns /dev/$1 > /tmp/listns.$1 2>&1 || { echo "(nvme list-ns failed)"; return 1; }
  for h in $(sed -n 's/.*\]: *0x\([0-9a-fA-F]*\).*/\1/p' /tmp/listns.$1); do echo $((0x$h)); done |
    sort -n | tr '\n' ' ' | sed 's/ $//'
}
# paths CTRL: the namespace IDs of CTRL's namespace paths in sysfs
# (nvmeYcZnN: Y subsystem, Z controller, N the head's instance, which need
# not be the NSID: its nsid attribute says), ascending, on one line.
paths() {
  for p in /sys/class/nvme/$1/nvme*c*n*; do
    [ -e "$p" ] || continue
    cat $p/nsid 2>/dev/null || echo "?${p##*/}"
  done | sort -n | tr '\n' ' ' | sed 's/ $//'
}
# path_names CTRL: the names of those paths.
path_names() { ls -d /sys/class/nvme/$1/nvme*c*n* 2>/dev/null | sed 's,.*/,,' | tr '\n' ' ' | sed 's/ $//'; }
# path_of CTRL NSID: the name of CTRL's path of namespace NSID.
path_of() {
  for p in /sys/class/nvme/$1/nvme*c*n*; do [ "$(cat $p/nsid 2>/dev/null)" = "$2" ] && echo ${p##*/}; done
}
# view CTRL: "list-ns <ids>, paths <ids>".
view() { echo "list-ns $(listed $1), paths $(paths $1)"; }
# sees CTRL IDS: CTRL lists exactly IDS and has paths for exactly those.
sees() { [ "$(listed $1)" = "$2" ] && [ "$(paths $1)" = "$2" ]; }
# ns_head NSID: the multipath block device (/dev/nvmeYnN) of $NQN's namespace NSID.
ns_head() {
  for b in /sys/block/nvme*n*; do
    [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = $NQN ] && [ "$(cat "$b/nsid" 2>/dev/null)" = "$1" ] &&
      [ -b "/dev/${b##*/}" ] && { echo "/dev/${b##*/}"; return 0; }
  done
  return 1
}
heads() {
  for b in /sys/block/nvme*n*; do
    [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = $NQN ] && [ -b "/dev/${b##*/}" ] && echo "${b##*/}(ns $(cat $b/nsid))"
  done | tr '\n' ' ' | sed 's/ $//'
}
# want_view CTRL HOST IDS WHY: CTRL's view is IDS (waiting 10 s at most).
want_view() {
  wait_for 10 sees $1 "$3" ||
    fail "$4: host $2 ($1) should see namespaces {$3}; it has $(view $1); nvme list-ns printed: $(cat /tmp/listns.$1); paths: $(path_names $1)"
  say "$4: host $2 ($1) sees {$3}: $(path_names $1)"
}

# ---------------------------------------------------------------- two hosts, three namespaces
for h in A B; do
  eval "hnqn=\$HNQN_$h; hid=\$HID_$h; port=\$PORT_$h"
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $port -n $NQN --hostnqn=$hnqn --hostid=$hid \
    > /tmp/connect.out 2>&1 || fail "nvme connect as host $h ($hnqn): $(cat /tmp/connect.out)"
  wait_for 20 ctrl_of $hnqn || fail "no controller of $NQN with hostnqn $hnqn in /sys/class/nvme"
done
CA=$(ctrl_of $HNQN_A); CB=$(ctrl_of $HNQN_B)
[ "$CA" != "$CB" ] || fail "hosts A and B share controller $CA"
for C in $CA $CB; do wait_for 20 is_live $C || fail "$C is $(cat /sys/class/nvme/$C/state), not live"; done
[ "$(cat /sys/class/nvme/$CA/hostid)" = $HID_A ] || fail "$CA has hostid $(cat /sys/class/nvme/$CA/hostid), not $HID_A"
[ "$(cat /sys/class/nvme/$CB/hostid)" = $HID_B ] || fail "$CB has hostid $(cat /sys/class/nvme/$CB/hostid), not $HID_B"
want_view $CA A "1 2" "connected"
want_view $CB B "1 3" "connected"
for n in 1 2 3; do wait_for 10 ns_head $n || fail "no block device for namespace $n; heads: $(heads)"; done
say "heads: $(heads)"

# Identify Namespace of B's namespace 3 through A: inactive, all zeroes.
/usr/bin/nvme id-ns /dev/$CA --namespace-id=3 --output-format=json > /tmp/idns-a3.json 2>&1 ||
  fail "nvme id-ns /dev/$CA -n 3 failed: $(cat /tmp/idns-a3.json)"
tr -d ' \t\r\n' < /tmp/idns-a3.json | grep -q '"nsze":0,' ||
  fail "Identify Namespace 3 through A ($CA) is not inactive (nsze 0): $(head -c 400 /tmp/idns-a3.json)"
/usr/bin/nvme id-ns /dev/$CB --namespace-id=3 --output-format=json > /tmp/idns-b3.json 2>&1 ||
  fail "nvme id-ns /dev/$CB -n 3 failed: $(cat /tmp/idns-b3.json)"
tr -d ' \t\r\n' < /tmp/idns-b3.json | grep -q '"nsze":0,' &&
  fail "Identify Namespace 3 through B ($CB) reports nsze 0: $(head -c 400 /tmp/idns-b3.json)"
say "Identify Namespace 3: nsze 0 through A, $(tr -d ' \t\r\n' < /tmp/idns-b3.json | sed -n 's/.*"nsze":\([0-9]*\).*/\1/p') blocks through B"

# Data on namespace 2, written while only A sees it.
dev2=$(ns_head 2)
dd if=/dev/urandom of=/tmp/ns2-a.bin bs=1M count=1 2>/dev/null
dd if=/tmp/ns2-a.bin of=$dev2 bs=1M seek=8 oflag=direct 2>/dev/null || fail "O_DIRECT write to $dev2 (namespace 2, through A)"
say "$dev2: 1 MiB written at 8 MiB through A"

# ---------------------------------------------------------------- move namespace 2 from A to B under I/O
dev1=$(ns_head 1)
/usr/bin/fio --name=bg --filename="$dev1" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k --iodepth=8 \
  --size=64M --time_based --runtime=20 --verify=crc32c --verify_fatal=1 --verify_state_save=0 --verify_backlog=256 \
  > /tmp/fio-bg.log 2>&1 &
FIO=$!
sleep 2

# Until /tmp/watch.stop: each change of the paths and heads, timed.
rm -f /tmp/watch.stop
(
  last=""
  while [ ! -f /tmp/watch.stop ]; do
    now="A: $(path_names $CA); B: $(path_names $CB); heads: $(heads)"
    [ "$now" != "$last" ] && { say "  $now"; last=$now; }
    sleep 0.05
  done
) > /tmp/watch.out 2>&1 &
echo $! > /tmp/watch.pid
sleep 0.3
kmsg_before=$(dmesg | wc -l)
# A reconnect would give a controller another controller ID.
cntlids=$(cat /sys/class/nvme/$CA/cntlid /sys/class/nvme/$CB/cntlid | tr '\n' ' ')
conf B
say "reload: namespace 2 from A to B"
reload || fail "reload moving namespace 2: $(cat /tmp/reload.err)"
grep -q "namespace 2 visible to 1 host(s)" /tmp/reload.out ||
  fail "the reload answer does not name namespace 2's new hosts: $(cat /tmp/reload.out)"
say "reload answered: $(cat /tmp/reload.out)"
moved() { sees $CA "1" && sees $CB "1 2 3"; }
wait_for 10 moved ||
  fail "namespace 2 did not move within 10 s: A ($CA) has $(view $CA), B ($CB) has $(view $CB); heads: $(heads)"
say "moved: A ($CA) $(view $CA); B ($CB) $(view $CB)"
sleep 1
touch /tmp/watch.stop; wait "$(cat /tmp/watch.pid)"; rm -f /tmp/watch.pid
say "what the kernel did (paths and heads as they changed):"
cat /tmp/watch.out
dmesg | tail -n +$((kmsg_before + 1)) | sed 's/^/  dmesg: /' | tail -20
for C in $CA $CB; do is_live $C || fail "$C is $(cat /sys/class/nvme/$C/state) after the move, not live"; done
[ "$(cat /sys/class/nvme/$CA/cntlid /sys/class/nvme/$CB/cntlid | tr '\n' ' ')" = "$cntlids" ] ||
  fail "the controllers reconnected during the move: controller IDs $cntlids before, $(cat /sys/class/nvme/$CA/cntlid /sys/class/nvme/$CB/cntlid | tr '\n' ' ')after"

# ---------------------------------------------------------------- namespace 2 through B
wait_for 10 ns_head 2 || fail "no block device for namespace 2 after the move; heads: $(heads)"
dev2b=$(ns_head 2)
say "namespace 2 is $dev2b (was $dev2), through B's path $(path_of $CB 2)"
dd if=$dev2b of=/tmp/ns2-b.bin bs=1M skip=8 count=1 iflag=direct 2>/dev/null || fail "O_DIRECT read from $dev2b (namespace 2, through B)"
cmp -s /tmp/ns2-a.bin /tmp/ns2-b.bin || fail "$dev2b: the 1 MiB written through A reads back different through B"
say "$dev2b: the data written through A reads back through B"
verify_blockdev "$dev2b" 4

# ---------------------------------------------------------------- fio, clean up
wait $FIO || { cat /tmp/fio-bg.log; fail "fio on $dev1 failed during the move"; }
fio_verified /tmp/fio-bg.log
say "fio on $dev1 (namespace 1, both paths): no error across the move; $FIO_VERIFIED"

for C in $CA $CB; do
  /usr/bin/nvme disconnect -d $C > /tmp/nv.out 2>&1 || fail "nvme disconnect -d $C: $(cat /tmp/nv.out)"
  wait_for 10 sh -c "! test -e /sys/class/nvme/$C" || fail "$C still present after nvme disconnect"
done
wait_for 10 sh -c "! ls $dev1 $dev2b /dev/nvme*n* 2>/dev/null" || fail "block devices left after both disconnects: $(ls /dev/nvme*n*)"
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
TARGET_PID=""
grep -E " (WARN|ERROR) " /tmp/target.log | head -5
say "kernel host, per-host namespace visibility over TCP: all checks passed"
