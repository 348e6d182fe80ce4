#!/usr/bin/env bash
# A throwaway one-node Ceph cluster (one mon, one memstore OSD, no mgr) on
# loopback, for the tests of rdmablk's RBD backend. Run as root; no systemd,
# nothing in /etc/ceph or /var/lib/ceph: everything lives in one directory.
#
# Usage: scripts/ceph-dev.sh up|down|status
#   up      start the cluster (or check the running one) and print the path of
#           its ceph.conf as the LAST line of stdout; progress goes to stderr.
#           A running healthy cluster is left alone; a dead or half-started
#           one is wiped and recreated (memstore keeps no data worth saving).
#   down    stop the daemons (SIGCONT, SIGTERM, then SIGKILL after a deadline)
#           and remove the directory. Succeeds when nothing runs.
#   status  print `ceph -s`, or say "not running" and exit 1.
#
# Directory: ${CEPH_DEV_DIR:-/tmp/rdmablk-ceph}, holding
#   ceph.conf                      the conf to pass to clients (-c / rados_conf_read_file)
#   ceph.client.admin.keyring      client.admin (all caps)
#   ceph.client.rdmablk.keyring    client.rdmablk: mon 'profile rbd', osd 'profile rbd pool=rbd'
#                                  (and mgr 'profile rbd pool=rbd', unused without a mgr)
#                                  (found through ceph.conf's keyring = $cluster.$name.keyring,
#                                  so `--id rdmablk` alone is enough)
#   ceph.client.reader.keyring     client.reader: mon 'profile rbd', osd 'profile rbd-read-only pool=rbd'
#                                  (a client that may only read images)
#   mon.a.pid, osd.0.pid           daemon pids (tests SIGSTOP/SIGCONT the OSD by osd.0.pid)
#   log/                           daemon logs (ceph-mon.a.log, ceph-osd.0.log, ceph.log, *.out)
#   mon.a/, osd.0/, run/           mon store, OSD data (memstore), admin sockets
# and, beside it, $DIR.lock: `up` and `down` hold it, so parallel tests calling
# `up` share one cluster.
# The mon listens on ADDR:3300 (msgr2) and ADDR:6789 (msgr1); the OSD binds to
# ADDR in the 6800-7300 range. ADDR is ${CEPH_DEV_ADDR:-127.0.0.1}, an address
# of this machine: the test command gives scripts/testnet.sh's bridge address,
# which network namespaces on that bridge reach too (the partition tests). A
# running cluster on another address is recreated. Pool `rbd` (size 1, 8 PGs) is
# created and initialised. The OSD holds ${CEPH_DEV_OSD_BYTES:-2147483648} bytes
# in memory (bench/scale.sh's thousands of images want more: `down`, then
# `up` with a larger one). There is no ceph-mgr: the mon creates PGs and
# librbd needs no mgr, but mgr-backed commands (`ceph pg stat`, `ceph df`
# details, `rbd perf`, `rbd task`) would hang, and `ceph -s` shows no PG stats.
set -euo pipefail

DIR=${CEPH_DEV_DIR:-/tmp/rdmablk-ceph}
CONF=$DIR/ceph.conf
MARK=$DIR/.rdmablk-ceph-dev
LOCK=$DIR.lock
ADDR=${CEPH_DEV_ADDR:-127.0.0.1}
OSD_BYTES=${CEPH_DEV_OSD_BYTES:-2147483648}
MON_V2=3300
MON_V1=6789
START=$SECONDS

log() { echo "ceph-dev: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "must run as root"
case "$DIR" in
  /* ) ;;
  * ) die "CEPH_DEV_DIR must be an absolute path, not '$DIR'" ;;
esac
[ "$DIR" != / ] || die "CEPH_DEV_DIR must not be /"
[[ "$ADDR" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "CEPH_DEV_ADDR must be an IPv4 address, not '$ADDR'"

# Admin CLI with deadlines: --connect-timeout bounds reaching the mon, timeout(1)
# bounds the command itself.
cph() { timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"; }
rds() { timeout 20 rados -c "$CONF" "$@"; }
rbdc() { timeout 30 rbd -c "$CONF" "$@"; }

# Pids of our daemons named $1 (ceph-mon or ceph-osd): those whose command
# line names our ceph.conf, whether or not a pid file was written.
our_pids() { # comm
  local p cmd comm
  for p in /proc/[0-9]*; do
    read -r comm <"$p/comm" 2>/dev/null || continue
    [ "$comm" = "$1" ] || continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    case " $cmd " in *" $CONF "*) echo "${p#/proc/}" ;; esac
  done
}

# Pid from a pid file if that process is alive and is the given daemon of ours.
live_pid() { # pidfile comm
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF " $CONF" || return 1
  echo "$pid"
}

# Stop our daemons named $1: SIGCONT (a test may have left the OSD
# SIGSTOPped, and a stopped process does not act on SIGTERM), SIGTERM, then
# SIGKILL after 10s.
stop_daemons() { # comm
  local pids p deadline
  pids=$(our_pids "$1")
  [ -n "$pids" ] || return 0
  log "stopping $1: $(echo "$pids" | tr '\n' ' ')"
  for p in $pids; do kill -CONT "$p" 2>/dev/null || true; done
  for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  while [ -n "$(our_pids "$1")" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  pids=$(our_pids "$1")
  [ -n "$pids" ] || return 0
  log "$1 still running 10s after SIGTERM, sending SIGKILL: $(echo "$pids" | tr '\n' ' ')"
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  while [ -n "$(our_pids "$1")" ] && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  [ -z "$(our_pids "$1")" ] || die "$1 survived SIGKILL: $(our_pids "$1" | tr '\n' ' ')"
}

do_down() {
  # The OSD first: on SIGTERM it tells the mon it is going down and waits
  # (osd_mon_shutdown_timeout, 5s) for an answer a dead mon never sends.
  stop_daemons ceph-osd
  stop_daemons ceph-mon
  if [ -e "$DIR" ]; then
    # Only remove a directory this script made (or an empty one).
    if [ -e "$MARK" ] || [ -z "$(ls -A "$DIR")" ]; then
      rm -rf "$DIR"
    else
      die "$DIR exists but was not made by ceph-dev.sh (no $MARK); not removing it"
    fi
  fi
}

# Proof of working I/O: write, read back and remove an object in pool rbd.
io_probe() {
  local f=$DIR/run/probe
  echo "ceph-dev probe $$" >"$f.in"
  rds -p rbd put ceph-dev-probe "$f.in" >/dev/null 2>&1 &&
    rds -p rbd get ceph-dev-probe "$f.out" >/dev/null 2>&1 &&
    cmp -s "$f.in" "$f.out" &&
    rds -p rbd rm ceph-dev-probe >/dev/null 2>&1
}

healthy() {
  local mon osd st
  [ -f "$CONF" ] || return 1
  grep -qF "mon_host = [v2:$ADDR:" "$CONF" || return 1
  mon=$(live_pid "$DIR/mon.a.pid" ceph-mon) || return 1
  osd=$(live_pid "$DIR/osd.0.pid" ceph-osd) || return 1
  st=$(awk '{print $3}' "/proc/$osd/stat" 2>/dev/null) || return 1
  if [ "$st" = T ]; then
    log "osd.0 (pid $osd) was stopped (SIGSTOP); continuing it"
    kill -CONT "$osd"
  fi
  cph osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1,' || return 1
  io_probe
}

# Wait until a command succeeds, at most $1 seconds; on timeout name the log.
wait_for() { # seconds what logfile cmd...
  local secs=$1 what=$2 logf=$3 deadline
  shift 3
  deadline=$((SECONDS + secs))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${secs}s waiting for $what; read $logf"
    sleep 0.5
  done
}

write_conf() { # fsid
  cat >"$CONF" <<EOF
# Written by scripts/ceph-dev.sh: a throwaway one-node cluster on $ADDR.
[global]
fsid = $1
mon_host = [v2:$ADDR:$MON_V2,v1:$ADDR:$MON_V1]
public_network = $ADDR/32
cluster_network = $ADDR/32
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
keyring = $DIR/\$cluster.\$name.keyring
run_dir = $DIR/run
crash_dir = $DIR/crash
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
# There is no mgr: without this the mon warns "no active mgr" after 60s.
mon_mgr_mkfs_grace = 31536000
# /tmp may be fuller than a real mon disk would be.
mon_data_avail_warn = 1
mon_data_avail_crit = 0
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0

[mon]
mon_data = $DIR/\$name
keyring = $DIR/\$name/keyring
pid_file = $DIR/\$name.pid
log_file = $DIR/log/\$cluster-\$name.log
mon_cluster_log_file = $DIR/log/\$cluster.log

[osd]
osd_data = $DIR/\$name
keyring = $DIR/\$name/keyring
pid_file = $DIR/\$name.pid
log_file = $DIR/log/\$cluster-\$name.log
osd_objectstore = memstore
memstore_device_bytes = $OSD_BYTES
public_addr = $ADDR
cluster_addr = $ADDR
osd_crush_initial_weight = 1
EOF
}

do_up() {
  if healthy; then
    log "already running ($((SECONDS - START))s)"
    echo "$CONF"
    return
  fi
  if [ -e "$DIR" ]; then
    log "stale or unhealthy cluster in $DIR: recreating"
  fi
  do_down
  if [ "$ADDR" != 127.0.0.1 ] && ! ip -4 -o addr show | grep -qF " $ADDR/"; then
    die "CEPH_DEV_ADDR $ADDR is no address of this machine (scripts/testnet.sh up makes 198.18.0.1)"
  fi
  if command -v ss >/dev/null; then
    local busy
    busy=$(ss -Hltnp "( sport = :$MON_V2 or sport = :$MON_V1 )" || true)
    [ -z "$busy" ] || die "mon ports $MON_V2/$MON_V1 are taken (another cluster?): $busy"
  fi

  mkdir -p "$DIR/log" "$DIR/run" "$DIR/crash" "$DIR/mon.a" "$DIR/osd.0"
  touch "$MARK"
  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$fsid"

  log "creating keys and mon"
  ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. \
    --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$DIR/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/ceph.client.admin.keyring" >/dev/null
  monmaptool --create --addv a "[v2:$ADDR:$MON_V2,v1:$ADDR:$MON_V1]" \
    --fsid "$fsid" "$DIR/monmap" >/dev/null
  ceph-mon --conf "$CONF" -i a --mkfs --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring" \
    >>"$DIR/log/mon.a.out" 2>&1 || die "ceph-mon --mkfs failed; read $DIR/log/mon.a.out"

  # Daemons fork into the background: they must not keep our stdout (a
  # caller reading it would never see EOF) nor the lock (fd 9).
  ceph-mon --conf "$CONF" -i a </dev/null >>"$DIR/log/mon.a.out" 2>&1 9>&- ||
    die "ceph-mon failed to start; read $DIR/log/ceph-mon.a.log and $DIR/log/mon.a.out"
  wait_for 30 "the mon to answer" "$DIR/log/ceph-mon.a.log" \
    eval 'cph mon stat >/dev/null 2>&1'

  log "creating osd.0 (memstore)"
  local uuid id
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(cph osd new "$uuid")
  [ "$id" = 0 ] || die "ceph osd new returned id '$id', expected 0"
  ceph-osd --conf "$CONF" -i 0 --mkfs --mkkey --osd-uuid "$uuid" --no-mon-config \
    </dev/null >>"$DIR/log/osd.0.out" 2>&1 9>&- ||
    die "ceph-osd --mkfs failed; read $DIR/log/ceph-osd.0.log and $DIR/log/osd.0.out"
  cph auth add osd.0 osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
    -i "$DIR/osd.0/keyring" >&2
  # On start the OSD puts itself into the CRUSH map (osd_crush_update_on_start).
  ceph-osd --conf "$CONF" -i 0 </dev/null >>"$DIR/log/osd.0.out" 2>&1 9>&- ||
    die "ceph-osd failed to start; read $DIR/log/ceph-osd.0.log and $DIR/log/osd.0.out"
  wait_for 60 "osd.0 to be up and in" "$DIR/log/ceph-osd.0.log" \
    eval 'cph osd stat -f json 2>/dev/null | grep -q "\"num_up_osds\":1,.*\"num_in_osds\":1,"'

  log "creating pool rbd and client.rdmablk"
  cph osd pool create rbd 8 8 replicated >&2
  cph osd pool set rbd size 1 --yes-i-really-mean-it >&2
  wait_for 60 "pool rbd to take I/O" "$DIR/log/ceph-osd.0.log" io_probe
  rbdc pool init rbd >&2
  cph auth get-or-create client.rdmablk mon 'profile rbd' osd 'profile rbd pool=rbd' \
    mgr 'profile rbd pool=rbd' -o "$DIR/ceph.client.rdmablk.keyring" >&2
  cph auth get-or-create client.reader mon 'profile rbd' osd 'profile rbd-read-only pool=rbd' \
    -o "$DIR/ceph.client.reader.keyring" >&2
  rbdc --id rdmablk create rbd/ceph-dev-probe --size 4M >&2 ||
    die "rbd create failed; read $DIR/log/ceph-osd.0.log"
  rbdc --id rdmablk rm rbd/ceph-dev-probe >/dev/null 2>&1 ||
    die "rbd rm failed; read $DIR/log/ceph-osd.0.log"

  log "up in $((SECONDS - START))s: mon pid $(cat "$DIR/mon.a.pid"), osd pid $(cat "$DIR/osd.0.pid")"
  echo "$CONF"
}

do_status() {
  if [ ! -f "$CONF" ] || ! live_pid "$DIR/mon.a.pid" ceph-mon >/dev/null; then
    echo "ceph-dev: not running ($DIR)"
    exit 1
  fi
  timeout 20 ceph -c "$CONF" --connect-timeout 5 -s || {
    echo "ceph-dev: not running (mon does not answer; read $DIR/log/ceph-mon.a.log)"
    exit 1
  }
  local osd
  if osd=$(live_pid "$DIR/osd.0.pid" ceph-osd); then
    echo "osd.0 pid $osd, state $(awk '{print $3}' "/proc/$osd/stat")"
  else
    echo "osd.0 process is not running"
  fi
}

cmd=${1:-}
case "$cmd" in
  up | down) ;;
  status) do_status; exit ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

# up and down exclusive, so parallel tests calling `up` share one cluster.
exec 9>"$LOCK"
timeout_lock=150
flock -w $timeout_lock 9 || die "another ceph-dev.sh holds $LOCK for over ${timeout_lock}s"
case "$cmd" in
  up) do_up ;;
  down)
    do_down
    log "down ($((SECONDS - START))s)"
    ;;
esac
