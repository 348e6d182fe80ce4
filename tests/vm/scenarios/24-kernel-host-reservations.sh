# NVMe reservations with the Linux NVMe/TCP host and stock nvme-cli: two
# host identities (host NQN and 128-bit host ID) connect to one subsystem
# with one file namespace, and the kernel makes one subsystem, one multipath
# block device, two paths. Each host acts through its own controller
# character device (/dev/nvmeX, --namespace-id=1): nvme-cli sends
# NVME_IOCTL_IO_CMD there, and with a single namespace the kernel runs it on
# that controller's own path (drivers/nvme/host/ioctl.c, nvme_dev_user_cmd:
# the controller's only nvme_ns, its ns->queue). Register both; A takes
# Write Exclusive: B's write conflicts and does not land, B reads, A writes;
# the extended report shows both host ids, keys, holder; B preempts and
# aborts A into Exclusive Access: A's reads and writes conflict, B writes;
# B sets PTPL, the target is killed (SIGKILL) and started again, both
# controllers reconnect and the report is byte for byte the same; Clear.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-resv
# A listener per host: nvme-cli 2.3 takes a second host NQN to an address
# and subsystem it is connected to for that connection ("already connected").
PORT_A=4436
PORT_B=4437
HID_A=6f1c2a3b-4d5e-4f60-8a71-b2c3d4e5f601
HID_B=0b9e8d7c-6a5b-4c3d-9e2f-1a0b2c3d4e02
HNQN_A=nqn.2014-08.org.nvmexpress:uuid:$HID_A
HNQN_B=nqn.2014-08.org.nvmexpress:uuid:$HID_B
# Keys wider than 32 bits (and below 2^53: exact whatever nvme-cli parses them with).
KA=20015998343868  # 0x123456789abc
KB=33933372192340  # 0x1edcba987654
KA2=38780996791245 # 0x23456789abcd
STATE=/tmp/resv-state
cleanup() {
  /usr/bin/nvme disconnect -n $NQN > /dev/null 2>&1
  [ -n "${TARGET_PID:-}" ] && kill -KILL "$TARGET_PID" 2>/dev/null
}
trap cleanup EXIT

rm -rf $STATE
truncate -s 32M /tmp/resv.img
cat > /tmp/resv.toml <<EOF
[reservations]
state_directory = "$STATE"

[[listener]]
transport = "tcp"
address = "127.0.0.1:$PORT_A"

[[listener]]
transport = "tcp"
address = "127.0.0.1:$PORT_B"

[[subsystem]]
nqn = "$NQN"
hosts = ["$HNQN_A", "$HNQN_B"]

    [[subsystem.namespace]]
    nsid = 1
    backend = "file"
    path = "/tmp/resv.img"
    reservations = true
EOF
start_target /tmp/target.log --config /tmp/resv.toml

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
both_down() { ! is_live $CA && ! is_live $CB; }
both_live() { is_live $CA && is_live $CB; }
# W CTRL FILE LBA / R CTRL LBA: nvme arguments of a one-block Write of FILE
# (opcode 01h) / Read (02h, raw data on stdout) at LBA through CTRL.
W() { echo "io-passthru /dev/$1 --opcode=1 --namespace-id=1 --data-len=$BS --write --input-file=$2 --cdw10=$3 --cdw11=0 --cdw12=0"; }
R() { echo "io-passthru /dev/$1 --opcode=2 --namespace-id=1 --data-len=$BS --read --raw-binary --cdw10=$2 --cdw11=0 --cdw12=0"; }
# nv WHY ARGS...: `nvme ARGS` must succeed.
nv() {
  why=$1; shift
  /usr/bin/nvme "$@" > /tmp/nv.out 2>&1 || fail "$why: nvme $* failed; nvme-cli printed: $(head -c 600 /tmp/nv.out)"
}
# conflict WHY ARGS...: `nvme ARGS` must fail with Reservation Conflict
# (nvme-cli 2.3 prints libnvme's "Reservation Conflict: ..." and the status,
# 0x4083 with DNR).
conflict() {
  why=$1; shift
  /usr/bin/nvme "$@" > /tmp/nv.out 2>&1 &&
    fail "$why: succeeded, expected Reservation Conflict (nvme $*); nvme-cli printed: $(head -c 600 /tmp/nv.out)"
  grep -qiE 'reservation conflict|\(0x0*(40)?83\)' /tmp/nv.out ||
    fail "$why: expected Reservation Conflict (nvme $*); nvme-cli printed: $(head -c 600 /tmp/nv.out)"
  say "$why: $(grep -i 'status' /tmp/nv.out | head -1)"
}
# rd WHY CTRL LBA FILE: reading LBA through CTRL succeeds and gives FILE's data.
rd() {
  /usr/bin/nvme $(R $2 $3) > /tmp/rd.bin 2> /tmp/nv.out ||
    fail "$1: read of LBA $3 through $2 failed; nvme-cli printed: $(cat /tmp/nv.out)"
  cmp -s /tmp/rd.bin $4 ||
    fail "$1: LBA $3 read through $2 is not the data of $4 ($(wc -c < /tmp/rd.bin) bytes read; nvme-cli: $(cat /tmp/nv.out))"
}
# report CTRL FILE WHY: `nvme resv-report --eds -o json` through CTRL into FILE.
report() {
  /usr/bin/nvme resv-report /dev/$1 --namespace-id=1 --eds --output-format=json > $2 2> /tmp/report.err ||
    fail "$3: nvme resv-report through $1 failed: $(cat /tmp/report.err $2)"
}
# hdr FILE KEY: a header field (gen, rtype, regctl, ptpls) of a JSON report.
hdr() { tr -d ' \t\r\n' < $1 | sed 's/"regctlext".*//' | sed -n "s/.*\"$2\":\([0-9][0-9]*\).*/\1/p"; }
# regs FILE: the registrants of a JSON report, sorted, one a line:
# "HOSTID RKEY RCSTS CNTLID" (nvme-cli prints the host id as 32 hex digits).
regs() {
  tr -d ' \t\r\n' < $1 | sed 's/.*"regctlext":\[//; s/\].*//' | tr '}' '\n' | awk '{
    h = ""; k = ""; s = ""; c = ""
    if (match($0, /"hostid":"[0-9a-fA-F]*"/)) h = substr($0, RSTART + 10, RLENGTH - 11)
    if (match($0, /"rkey":[0-9]+/)) k = substr($0, RSTART + 7, RLENGTH - 7)
    if (match($0, /"rcsts":[0-9]+/)) s = substr($0, RSTART + 8, RLENGTH - 8)
    if (match($0, /"cntlid":[0-9]+/)) c = substr($0, RSTART + 9, RLENGTH - 9)
    if (h != "") print tolower(h), k, s, c }' | sort
}
# line HOSTID KEY RCSTS: a registrant as regs prints it (a host: cntlid FFFFh).
line() { echo "$(echo $1 | sed 's/-//g') $2 $3 65535"; }
# want_report CTRL WHY RTYPE [LINE...]: the report through CTRL (kept in
# /tmp/report.json) shows reservation type RTYPE and exactly these registrants.
want_report() {
  wctl=$1; why=$2; wrt=$3; shift 3
  report $wctl /tmp/report.json "$why"
  got=$(regs /tmp/report.json)
  want=$(for l in "$@"; do echo "$l"; done | sort)
  [ "$(hdr /tmp/report.json rtype)" = "$wrt" ] ||
    fail "$why: rtype $(hdr /tmp/report.json rtype), expected $wrt; nvme resv-report through $wctl printed: $(cat /tmp/report.json)"
  [ "$(hdr /tmp/report.json regctl)" = $# ] ||
    fail "$why: regctl $(hdr /tmp/report.json regctl), expected $#; nvme resv-report through $wctl printed: $(cat /tmp/report.json)"
  [ "$got" = "$want" ] || fail "$why: registrants (hostid rkey rcsts cntlid):
$got
expected:
$want
nvme resv-report through $wctl printed: $(cat /tmp/report.json)"
  say "$why: rtype $wrt, $# registrant(s), gen $(hdr /tmp/report.json gen), ptpls $(hdr /tmp/report.json ptpls)"
}

# ---------------------------------------------------------------- two hosts, one namespace
for h in A B; do
  eval "hnqn=\$HNQN_$h; hid=\$HID_$h; port=\$PORT_$h"
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $port -n $NQN --hostnqn=$hnqn --hostid=$hid \
    --reconnect-delay=1 --ctrl-loss-tmo=60 > /tmp/connect.out 2>&1 ||
    fail "nvme connect as host $h ($hnqn): $(cat /tmp/connect.out)"
  wait_for 20 ctrl_of $hnqn || fail "no controller of $NQN with hostnqn $hnqn in /sys/class/nvme"
done
CA=$(ctrl_of $HNQN_A); CB=$(ctrl_of $HNQN_B)
[ "$CA" != "$CB" ] || fail "hosts A and B share controller $CA"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev=$(nvme_blk $NQN)
for C in $CA $CB; do
  wait_for 20 is_live $C || fail "$C is $(cat /sys/class/nvme/$C/state), not live"
  wait_for 20 sh -c "ls -d /sys/class/nvme/$C/nvme*c*n*" || fail "$C has no namespace path: $(ls /sys/class/nvme/$C)"
  # nvme<subsystem>c<controller>n<head>: a path of the head nvme<subsystem>n<head>
  p=$(ls -d /sys/class/nvme/$C/nvme*c*n* | head -1); p=${p##*/}
  [ "${p%%c*}n${p##*n}" = "${dev##*/}" ] || fail "$C's path $p is not a path of $dev: not one subsystem"
  [ $(ls -d /sys/class/nvme/$C/nvme*c*n* | wc -l) = 1 ] || fail "$C has more than one namespace: $(ls -d /sys/class/nvme/$C/nvme*c*n*)"
done
[ "$(cat /sys/class/nvme/$CA/hostid)" = $HID_A ] || fail "$CA has hostid $(cat /sys/class/nvme/$CA/hostid), not $HID_A"
[ "$(cat /sys/class/nvme/$CB/hostid)" = $HID_B ] || fail "$CB has hostid $(cat /sys/class/nvme/$CB/hostid), not $HID_B"
BS=$(cat /sys/block/${dev##*/}/queue/logical_block_size)
case "$BS" in 512|4096) ;; *) fail "$dev reports a logical block size of '$BS'";; esac
say "$dev: host A through $CA, host B through $CB, $BS-byte blocks"
for f in wa wa2 wb wb2; do dd if=/dev/urandom of=/tmp/$f.bin bs=$BS count=1 2>/dev/null; done

want_report $CA "fresh namespace" 0
[ "$(hdr /tmp/report.json ptpls)" = 0 ] || fail "PTPL is on before anyone set it: $(cat /tmp/report.json)"

# ---------------------------------------------------------------- register; A: Write Exclusive
nv "A registers" resv-register /dev/$CA --namespace-id=1 --nrkey=$KA --rrega=0
nv "B registers" resv-register /dev/$CB --namespace-id=1 --nrkey=$KB --rrega=0
want_report $CB "A and B registered" 0 "$(line $HID_A $KA 0)" "$(line $HID_B $KB 0)"
nv "A acquires Write Exclusive" resv-acquire /dev/$CA --namespace-id=1 --crkey=$KA --rtype=1 --racqa=0
conflict "B acquires while A holds" resv-acquire /dev/$CB --namespace-id=1 --crkey=$KB --rtype=1 --racqa=0
nv "A (holder) writes LBA 16" $(W $CA /tmp/wa.bin 16)
conflict "B writes LBA 16 under A's Write Exclusive" $(W $CB /tmp/wb.bin 16)
rd "B reads under A's Write Exclusive (B's write did not land)" $CB 16 /tmp/wa.bin
say "Write Exclusive: A writes, B reads A's data, B's write refused"

want_report $CB "A holds Write Exclusive" 1 "$(line $HID_A $KA 1)" "$(line $HID_B $KB 0)"
g1=$(hdr /tmp/report.json gen)
report $CA /tmp/report-a.json "the same report through A"
cmp -s /tmp/report.json /tmp/report-a.json ||
  fail "the reports through A and B differ: B: $(cat /tmp/report.json) A: $(cat /tmp/report-a.json)"

# ---------------------------------------------------------------- B: preempt and abort into Exclusive Access
nv "B preempts and aborts A" resv-acquire /dev/$CB --namespace-id=1 --crkey=$KB --prkey=$KA --rtype=2 --racqa=2
want_report $CB "B preempted A" 2 "$(line $HID_B $KB 1)"
g2=$(hdr /tmp/report.json gen)
[ "$g2" -gt "$g1" ] || fail "the generation did not move with the preempt: $g1 before, $g2 after"
conflict "A writes under B's Exclusive Access" $(W $CA /tmp/wa2.bin 16)
conflict "A reads under B's Exclusive Access" $(R $CA 16)
nv "B (holder) writes LBA 17" $(W $CB /tmp/wb.bin 17)
rd "B reads back LBA 17" $CB 17 /tmp/wb.bin
rd "A's refused write did not land" $CB 16 /tmp/wa.bin

# ---------------------------------------------------------------- PTPL across a target restart
nv "A registers again" resv-register /dev/$CA --namespace-id=1 --nrkey=$KA2 --rrega=0
nv "B sets PTPL (replace with the same key, cptpl 3)" resv-register /dev/$CB --namespace-id=1 --crkey=$KB --nrkey=$KB --rrega=2 --cptpl=3
want_report $CB "PTPL set" 2 "$(line $HID_A $KA2 0)" "$(line $HID_B $KB 1)"
[ "$(hdr /tmp/report.json ptpls)" = 1 ] || fail "ptpls is not 1 after --cptpl=3: $(cat /tmp/report.json)"
cp /tmp/report.json /tmp/resv-before.json
[ -f "$STATE/$NQN.ns1.ptpl" ] || fail "no state file $STATE/$NQN.ns1.ptpl with PTPL set: $(ls -la $STATE 2>&1)"
say "state file: $(ls -l "$STATE/$NQN.ns1.ptpl")"
conflict "A (registrant, not holder) reads under Exclusive Access" $(R $CA 16)

kill -KILL $TARGET_PID; wait $TARGET_PID 2>/dev/null
say "target killed"
wait_for 20 both_down || fail "the controllers did not notice the target's death: $CA $(cat /sys/class/nvme/$CA/state), $CB $(cat /sys/class/nvme/$CB/state)"
mv /tmp/target.log /tmp/target-first.log
start_target /tmp/target.log --config /tmp/resv.toml
wait_for 60 both_live || fail "not both controllers live 60 s after the restart: $CA $(cat /sys/class/nvme/$CA/state), $CB $(cat /sys/class/nvme/$CB/state)"
say "target restarted, $CA and $CB live again"
ls $STATE/*.refused > /dev/null 2>&1 && fail "the target refused its state file: $(ls -la $STATE; grep ERROR /tmp/target.log)"
report $CB /tmp/resv-after.json "after the restart"
cmp -s /tmp/resv-before.json /tmp/resv-after.json ||
  fail "the report changed across the restart; before: $(cat /tmp/resv-before.json) after: $(cat /tmp/resv-after.json)"
report $CA /tmp/resv-after-a.json "after the restart, through A"
cmp -s /tmp/resv-before.json /tmp/resv-after-a.json ||
  fail "the report through A differs after the restart: $(cat /tmp/resv-after-a.json)"
say "report identical across the restart: rtype 2, gen $(hdr /tmp/resv-after.json gen), ptpls 1, both registrants"
conflict "A writes after the restart" $(W $CA /tmp/wa2.bin 16)
nv "B writes LBA 18 after the restart" $(W $CB /tmp/wb2.bin 18)
rd "B reads back LBA 18" $CB 18 /tmp/wb2.bin
rd "LBA 17 across the restart" $CB 17 /tmp/wb.bin

# ---------------------------------------------------------------- Clear; clean up
nv "B clears" resv-release /dev/$CB --namespace-id=1 --crkey=$KB --rtype=2 --rrela=1
want_report $CA "cleared" 0
nv "A writes with no reservation" $(W $CA /tmp/wa2.bin 16)
rd "A's write landed" $CB 16 /tmp/wa2.bin

for C in $CA $CB; do
  /usr/bin/nvme disconnect -d $C > /tmp/nv.out 2>&1 || fail "nvme disconnect -d $C: $(cat /tmp/nv.out)"
  wait_for 10 sh -c "! test -e /sys/class/nvme/$C" || fail "$C still present after nvme disconnect"
done
wait_for 10 sh -c "! ls $dev" || fail "$dev still present after both disconnects"
kill -0 $TARGET_PID || fail "rdmablk-target died"
stop_target
TARGET_PID=""
grep -E " (WARN|ERROR) " /tmp/target-first.log /tmp/target.log | head -5
say "kernel host, NVMe reservations over TCP: all checks passed"
