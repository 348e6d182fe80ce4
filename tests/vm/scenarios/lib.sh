# Helpers for VM scenarios (busybox sh in the guest). Tools that busybox also
# provides are called by full path: its applets shadow them otherwise.
say() { echo "[$(cut -d' ' -f1 /proc/uptime)s] $*"; }
fail() { echo "FAILED: $*"; dmesg | tail -8; for f in /tmp/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done; exit 1; }
check() { "$@" || fail "command failed: $*"; }

# wait_for SECONDS COMMAND...: polls until the command succeeds.
wait_for() {
  t=$1; shift; i=0
  while ! "$@" >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -gt $((t * 5)) ] && return 1; sleep 0.2
  done
}

# disconnect_cleanly NQN DEV WHAT: `nvme disconnect` of NQN, whose block
# device DEV goes; the kernel host logs no error while it shuts the
# controller down and deletes its queues (a completion for a command it no
# longer has, say an AER, is "tag ... not found"), and the target's log
# (/tmp/target.log) no H2CTermReq or error of the host.
disconnect_cleanly() {
  before=$(dmesg | wc -l)
  tbefore=$(wc -l < /tmp/target.log)
  /usr/bin/nvme disconnect -n "$1" || fail "nvme disconnect ($3)"
  wait_for 10 sh -c "! ls /dev/$(basename "$2")" || fail "$2 still present after disconnect ($3)"
  bad=$(dmesg | tail -n +$((before + 1)) | grep -Ei "nvme.*(error|fail|not found|timeout|abort)")
  [ -z "$bad" ] || fail "the kernel host logged at the disconnect ($3): $bad"
  bad=$(tail -n +$((tbefore + 1)) /tmp/target.log | grep -E "H2CTermReq| ERROR ")
  [ -z "$bad" ] || fail "the target logged at the disconnect ($3): $bad"
  say "$3: the disconnect was clean on both sides"
}

# exited PID: whether the background job PID has ended (a zombie until the
# shell waits for it, which `kill -0` still finds).
exited() { ! [ -e "/proc/$1/stat" ] || grep -q ') Z ' "/proc/$1/stat"; }

# start_target LOG ARGS...: starts rdmablk-target and waits until it listens.
start_target() {
  tlog=$1; shift
  # Emptied here, not by the background job's redirection: the wait below
  # must not find an earlier scenario's "listening on" before that runs.
  : > "$tlog"
  RUST_LOG=${TARGET_RUST_LOG:-info} rdmablk-target "$@" > /dev/null 2> "$tlog" &
  TARGET_PID=$!
  wait_for 60 grep -q "listening on" "$tlog" || fail "rdmablk-target did not start within 60 s"
}

# tlshd_up: tlshd, the agent that does the kernel's TLS handshakes (NVMe/TCP
# host and nvmet), running in the background once per boot with its log in
# /tmp/tlshd.log (/etc/tlshd.conf: loglevel 1, the .nvme keyring), with
# kTLS and its AES-GCM loaded (the sockets it hands back use them). nvme-tcp
# goes first: tlshd links the .nvme keyring, which nvme-keyring creates,
# into its session keyring when it starts.
tlshd_up() {
  for m in tls gcm nvme-tcp; do /usr/bin/modprobe $m || fail "modprobe $m"; done
  /usr/bin/modprobe aesni-intel 2>/dev/null; /usr/bin/modprobe ghash-clmulni-intel 2>/dev/null
  [ -n "${TLSHD_PID:-}" ] && ! exited "$TLSHD_PID" && return 0
  pid=$(pidof tlshd) && { TLSHD_PID=${pid%% *}; return 0; }
  /usr/bin/tlshd -s >> /tmp/tlshd.log 2>&1 &
  TLSHD_PID=$!
  sleep 1
  exited "$TLSHD_PID" && fail "tlshd exited at start: $(cat /tmp/tlshd.log)"
  say "tlshd running (pid $TLSHD_PID)"
}

# stop_target: SIGTERM, and the exit status must be 0.
stop_target() {
  kill -TERM "$TARGET_PID"; wait "$TARGET_PID"; rc=$?
  [ $rc -eq 0 ] || fail "rdmablk-target exited with $rc"
}

# nvme_blk NQN: the block device of the connected subsystem NQN.
nvme_blk() {
  for b in /sys/block/nvme*n*; do
    [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ] && [ -b "/dev/${b##*/}" ] && { echo "/dev/${b##*/}"; return 0; }
  done
  return 1
}

# verify_blockdev DEV MiB: O_DIRECT random-pattern write and read-back.
verify_blockdev() {
  dd if=/dev/urandom of=/tmp/pat bs=1M count="$2" 2>/dev/null
  dd if=/tmp/pat of="$1" bs=1M oflag=direct 2>/dev/null || fail "O_DIRECT write to $1"
  dd if="$1" of=/tmp/back bs=1M count="$2" iflag=direct 2>/dev/null || fail "O_DIRECT read from $1"
  cmp /tmp/pat /tmp/back || fail "$1: read-back differs from what was written"
  say "$1: $2 MiB O_DIRECT write/read-back verified"
}

# verify_ext4 DEV: mkfs, files, remount, compare.
verify_ext4() {
  /usr/bin/mke2fs -q -F -t ext4 "$1" || fail "mkfs.ext4 $1"
  mkdir -p /mnt/fs
  mount -t ext4 "$1" /mnt/fs || fail "mount $1"
  dd if=/dev/urandom of=/tmp/f1 bs=1M count=4 2>/dev/null
  cp /tmp/f1 /mnt/fs/f1; echo rdmablk > /mnt/fs/hello; sync
  umount /mnt/fs; mount -t ext4 "$1" /mnt/fs || fail "remount $1"
  cmp /tmp/f1 /mnt/fs/f1 || fail "file differs after remount"
  [ "$(cat /mnt/fs/hello)" = rdmablk ] || fail "small file differs after remount"
  umount /mnt/fs
  say "$1: mkfs.ext4, files, remount verified"
}

# nvmet_export TRTYPE TRADDR NQN FILE PORT [tls]: exports FILE as namespace 1
# of subsystem NQN (any host) through kernel nvmet-TRTYPE on TRADDR:PORT;
# with tls, the port requires TLS 1.3 (addr_tsas; its PSKs are those in
# .nvme, its handshakes tlshd's: see tlshd_up). The configfs port is named
# PORT: use a port number once per boot.
nvmet_export() {
  /usr/bin/modprobe "nvmet-$1" || fail "modprobe nvmet-$1"
  grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs configfs /sys/kernel/config
  n=/sys/kernel/config/nvmet
  mkdir -p "$n/subsystems/$3/namespaces/1"
  echo 1 > "$n/subsystems/$3/attr_allow_any_host"
  echo -n "$4" > "$n/subsystems/$3/namespaces/1/device_path"
  echo 1 > "$n/subsystems/$3/namespaces/1/enable" || fail "nvmet namespace enable"
  p=$n/ports/$5; mkdir -p "$p"
  echo "$1" > "$p/addr_trtype"; echo ipv4 > "$p/addr_adrfam"
  echo "$2" > "$p/addr_traddr"; echo "$5" > "$p/addr_trsvcid"
  if [ "${6:-}" = tls ]; then
    echo tls1.3 > "$p/addr_tsas" || fail "nvmet port $5: addr_tsas tls1.3 refused"
    [ "$(cat "$p/addr_treq")" = required ] || fail "nvmet port $5: addr_treq is '$(cat "$p/addr_treq")', not required"
  fi
  ln -s "$n/subsystems/$3" "$p/subsystems/$3" || fail "nvmet port link ($1 $2:$5)"
}

# nvmet_tcp_export NQN FILE PORT [tls]: exports FILE through kernel nvmet-tcp.
nvmet_tcp_export() { nvmet_export tcp 127.0.0.1 "$@"; }

# nvmet_rdma_export NQN FILE PORT: exports FILE through kernel nvmet-rdma on
# $RDMA_IP (brings rxe0 up first).
nvmet_rdma_export() { rxe_up; nvmet_export rdma "$RDMA_IP" "$@"; }

# rxe_up: soft-RoCE device rxe0 on eth0, with the user verbs and rdma_cm
# devices; exports RDMA_IP, eth0's IPv4 address, which both ends of an RDMA
# connection in the guest use (rxe needs a real netdev: not 127.0.0.1), and
# RDMA_GID_INDEX, the GID of that address for tools that take -x. A second
# call only sets the variables.
rxe_up() {
  RDMA_IP=$(/usr/bin/ip -4 -o addr show dev eth0 2>/dev/null | awk '{sub("/.*", "", $4); print $4; exit}')
  [ -n "$RDMA_IP" ] || fail "eth0 has no IPv4 address"
  if [ ! -d /sys/class/infiniband/rxe0 ]; then
    # rxe computes its ICRC with the crc32 shash, which nothing loads for it.
    for m in crc32_generic rdma_rxe ib_uverbs rdma_ucm ib_umad; do
      /usr/bin/modprobe $m || fail "modprobe $m"
    done
    /usr/bin/rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 on eth0"
  fi
  wait_for 10 grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state ||
    fail "rxe0 port not active: $(cat /sys/class/infiniband/rxe0/ports/1/state)"
  # The IPv4 GID is ::ffff:a.b.c.d; it appears shortly after the link.
  gid=$(echo "$RDMA_IP" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
  RDMA_GID_INDEX=""
  wait_for 10 grep -qx "$gid" /sys/class/infiniband/rxe0/ports/1/gids/* || fail "rxe0 has no GID for $RDMA_IP"
  for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    [ "$(cat "$g" 2>/dev/null)" = "$gid" ] && { RDMA_GID_INDEX=${g##*/}; break; }
  done
  [ -c /dev/infiniband/uverbs0 ] || fail "no /dev/infiniband/uverbs0"
  export RDMA_IP RDMA_GID_INDEX
}

# ublk_up LOG ARGS...: starts `rdmablk connect ARGS --ublk` and waits for its
# device; sets UBLK_PID and UBLK_DEV.
ublk_up() {
  ulog=$1; shift
  : > "$ulog.out"  # (as in start_target: no earlier "ready: " to find)
  RUST_LOG=info rdmablk connect "$@" --ublk > "$ulog.out" 2> "$ulog" &
  UBLK_PID=$!
  wait_for 30 grep -q "^ready: " "$ulog.out" || fail "rdmablk connect --ublk did not become ready"
  UBLK_DEV=$(sed -n 's/^ready: //p' "$ulog.out")
  [ -b "$UBLK_DEV" ] || fail "$UBLK_DEV is not a block device"
  # Every stderr line is one of our log lines: nothing printed behind its back.
  if grep -qv '^20[0-9][0-9]-' "$ulog"; then grep -v '^20[0-9][0-9]-' "$ulog"; fail "stray output on stderr"; fi
}

# ublk_down: SIGTERM; exit status 0 and the device gone.
ublk_down() {
  kill -TERM "$UBLK_PID"; wait "$UBLK_PID"; rc=$?
  [ $rc -eq 0 ] || fail "rdmablk connect --ublk exited with $rc"
  wait_for 10 sh -c "! ls $UBLK_DEV" || fail "$UBLK_DEV still present after SIGTERM"
}

# fio_verify DEV SIZE [FIO ARGS...]: O_DIRECT random writes with CRC32C
# verification of every block read back.
fio_verify() {
  dev=$1; size=$2; shift 2
  /usr/bin/fio --name=verify --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite \
    --bs=64k --iodepth=16 --size="$size" --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --eta=never --output=/tmp/fio-verify.log "$@" || { tail -30 /tmp/fio-verify.log; fail "fio verify on $dev"; }
  grep -q "verify:.*bad\|err= *[1-9]" /tmp/fio-verify.log && { tail -30 /tmp/fio-verify.log; fail "fio reported errors on $dev"; }
  say "$dev: fio random writes of $size verified"
}

# fio_verified LOG: the background fio job whose output is LOG (time-based
# random writes with --verify_backlog) ended cleanly and read back what it
# wrote. Its reads verify the writes as fio goes (a time-based write phase
# leaves no time for a verify phase at its end); fio counts them in "issued
# rwts: total=READS,WRITES,...". Sets FIO_VERIFIED ("W writes, R verified
# by reads") for the scenario's message.
fio_verified() {
  grep -qi "verify\|error" "$1" && { cat "$1"; fail "fio reported errors"; }
  grep -q "err= 0" "$1" || { cat "$1"; fail "fio did not finish cleanly"; }
  rw=$(sed -n 's/.*issued rwts: total=\([0-9]*\),\([0-9]*\),.*/\1 \2/p' "$1")
  [ "${rw%% *}" -gt 0 ] 2>/dev/null || { cat "$1"; fail "fio read nothing back (issued reads,writes: '$rw'): no verification"; }
  FIO_VERIFIED="${rw#* } writes, ${rw%% *} verified by reads"
}

# fio_run DEV RW BS QD SECONDS: one line "RW BS: IOPS, MiB/s, p50" from
# fio's terse output (read side: field 7 KiB/s, 8 IOPS, 18-37 clat percentiles).
fio_run() {
  fio --name=cmp --filename="$1" --ioengine=io_uring --direct=1 --rw="$2" --bs="$3" --iodepth="$4" \
    --time_based --runtime="$5" --size=64M --minimal 2>/dev/null |
    awk -F';' -v rw="$2" -v bs="$3" '{p50 = "?"; for (i = 18; i <= 37; i++) if ($i ~ /^50\.0+%=/) { split($i, a, "="); p50 = a[2] }
      printf "%s %s: %d IOPS, %.1f MiB/s, p50 %s us\n", rw, bs, $8, $7 / 1024, p50}'
}

# suite_or_bench SHORT LONG: a load's length (seconds, or MiB written before
# it) in a comparison scenario: SHORT in the test suite, where the loads only
# have to run and move data; LONG when bench/vm.sh boots the VM for the
# figures (VM_MEASURE=1).
suite_or_bench() { if [ "${MEASURE:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi; }

# compare LOAD SIDE FILE: prints FILE's first line as "COMPARE LOAD SIDE
# <line>" (the line bench/vm.sh reads its ratios from: each LOAD's first SIDE
# over its second) and fails unless the line reports a load that moved
# data (a non-zero "IOPS") or, for a CPU line, a cost per I/O.
compare() {
  line=$(head -1 "$3")
  echo "$line" | grep -qE '(^|[^0-9.])[1-9][0-9]*(\.[0-9]+)? IOPS|[0-9.]+ us per I/O' ||
    { cat "$3"; fail "$1 on $2: no figure in '$line'"; }
  echo "COMPARE $1 $2 $line"
}

# auth_config FILE URL NQN HOSTNQN HOST_KEY [CTRL_KEY [DHGROUP]]: an
# rdmablk-target configuration (mode 0600) listening on URL
# (transport://addr:port) with subsystem NQN, one 64 MiB memory namespace,
# that HOSTNQN reaches with DH-HMAC-CHAP (a controller secret and a single
# DH group when given).
auth_config() {
  {
    printf '[[listener]]\ntransport = "%s"\naddress = "%s"\n\n' "${2%%://*}" "${2#*://}"
    printf '[[subsystem]]\nnqn = "%s"\n' "$3"
    printf '  [[subsystem.host]]\n  nqn = "%s"\n  dhchap_secret = "%s"\n' "$4" "$5"
    [ -n "${6:-}" ] && printf '  dhchap_ctrl_secret = "%s"\n' "$6"
    [ -n "${7:-}" ] && printf '  dhchap_dhgroup = ["%s"]\n' "$7"
    printf '  [[subsystem.namespace]]\n  backend = "memory"\n  size = "64MiB"\n'
  } > "$1"
  chmod 600 "$1"
}

# Two gateways (ANA scenarios). gw_conf NAME URL STATE CNTLID_MIN
# CNTLID_MAX: /tmp/gw-NAME.toml, a gateway listening on URL
# (transport://addr:port) that exports /tmp/ana.img as namespace 1 (ANA
# group 1, reported STATE) of $ANA_NQN, with controller ids from its range.
gw_conf() {
  {
    printf '[[listener]]\ntransport = "%s"\naddress = "%s"\n' "${2%%://*}" "${2#*://}"
    printf 'ana_groups = { 1 = "%s" }\n\n' "$3"
    printf '[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n' "$ANA_NQN"
    printf 'cntlid_min = %s\ncntlid_max = %s\n' "$4" "$5"
    printf '  [[subsystem.namespace]]\n  backend = "file"\n  path = "/tmp/ana.img"\n'
  } > "/tmp/gw-$1.toml"
}

# gw_start NAME: starts gateway NAME (its log /tmp/gw-NAME.log, control
# socket /tmp/gw-NAME.sock); sets GW_PID_NAME.
gw_start() {
  start_target "/tmp/gw-$1.log" --config "/tmp/gw-$1.toml" --control "/tmp/gw-$1.sock"
  eval "GW_PID_$1=$TARGET_PID"
}

# gw PORT: what the kernel host says of the path through the controller
# connected to port PORT: "CTRL_STATE ANA_STATE" (e.g. "live optimized").
gw() {
  for c in /sys/class/nvme/nvme*; do
    grep -q "trsvcid=$1" "$c/address" 2>/dev/null || continue
    echo "$(cat "$c/state") $(cat "$c"/nvme*c*n1/ana_state 2>/dev/null)"
    return 0
  done
  echo "no controller"
}

# gw_is PORT WANT: whether `gw PORT` says WANT.
gw_is() { [ "$(gw "$1")" = "$2" ]; }

# gw_wait SECONDS PORT WANT WHY: waits until the path through PORT is WANT.
gw_wait() {
  wait_for "$1" gw_is "$2" "$3" || fail "$4: the path through port $2 is '$(gw "$2")' after $1 s, not '$3'"
  say "$4: port $2 is $3"
}

# fio_passes DEV: in the background, O_DIRECT 4 KiB random-write passes
# over 16 MiB of DEV, each verified (CRC32C, as it goes and at its end),
# until /tmp/fio.stop exists; /tmp/fio.passes counts the passes done,
# /tmp/fio.failed names a failed one. Sets FIO_PID.
fio_passes() {
  rm -f /tmp/fio.stop /tmp/fio.failed; echo 0 > /tmp/fio.passes
  (
    n=0
    while [ ! -f /tmp/fio.stop ]; do
      /usr/bin/fio --name=pass --filename="$1" --ioengine=io_uring --direct=1 --rw=randwrite \
        --bs=4k --iodepth=16 --size=16M --verify=crc32c --verify_backlog=512 --verify_fatal=1 \
        --do_verify=1 --eta=never --output="/tmp/fio-pass.log" ||
        { cp /tmp/fio-pass.log /tmp/fio-failed.log; echo "pass $n" > /tmp/fio.failed; exit 1; }
      grep -q "err= *[1-9]" /tmp/fio-pass.log && { cp /tmp/fio-pass.log /tmp/fio-failed.log; echo "pass $n" > /tmp/fio.failed; exit 1; }
      n=$((n + 1)); echo $n > /tmp/fio.passes
    done
  ) &
  FIO_PID=$!
}

# fio_more N WHY: waits (60 s at most) until N more fio passes have
# completed than now, failing on a failed pass.
fio_more() {
  want=$(( $(cat /tmp/fio.passes) + $1 ))
  wait_for 60 sh -c "[ -f /tmp/fio.failed ] || [ \$(cat /tmp/fio.passes) -ge $want ]"
  [ -f /tmp/fio.failed ] && { tail -30 /tmp/fio-failed.log; fail "fio $(cat /tmp/fio.failed) failed: $2"; }
  [ "$(cat /tmp/fio.passes)" -ge "$want" ] || fail "fio made no progress within 60 s: $2"
  say "fio: $(cat /tmp/fio.passes) verified passes ($2)"
}

# gw_kill_and_restart_a PORT: SIGKILL of gateway A (on PORT, optimized),
# I/O going on through the other path, A started again 10 s later and its
# path back to live optimized, fio passes completing throughout.
gw_kill_and_restart_a() {
  kill -KILL "$GW_PID_a"; wait "$GW_PID_a" 2>/dev/null
  say "gateway A killed"
  gw_wait 10 "$1" "connecting optimized" "A dead"
  fio_more 1 "A dead, I/O on the other path"
  sleep 10
  mv /tmp/gw-a.log /tmp/gw-a-first.log
  gw_start a
  gw_wait 30 "$1" "live optimized" "A restarted"
  fio_more 1 "A back"
}

# fio_stop: ends the passes; none may have failed.
fio_stop() {
  touch /tmp/fio.stop
  wait "$FIO_PID"
  [ -f /tmp/fio.failed ] && { tail -30 /tmp/fio-failed.log; fail "fio $(cat /tmp/fio.failed) failed"; }
  say "fio: $(cat /tmp/fio.passes) passes verified, no I/O error"
}
