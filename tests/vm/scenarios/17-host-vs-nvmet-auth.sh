# rdmablk against the Linux kernel target (nvmet-tcp) with DH-HMAC-CHAP set
# through configfs (dhchap_key, dhchap_ctrl_key, dhchap_hash,
# dhchap_dhgroup): bench --verify one-way and bidirectional, with each
# hash; a wrong host secret is refused by nvmet, a wrong controller secret
# by rdmablk. Then the Linux host against rdmablk-target over NVMe/RDMA:
# each hash, null and ffdhe2048, one-way and bidirectional, and a wrong
# host secret refused.
. /scenarios/lib.sh
NQN=nqn.2026-11.io.rdmablk:vm-nvmet-auth
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:0e2d6c1b-7a8f-4c3e-9d5b-1f2a3b4c5d6e
key() { /usr/bin/nvme gen-dhchap-key --hmac="$1" --nqn="$HOSTNQN" 2>/dev/null | tr -d '\n'; }
truncate -s 64M /tmp/nvmet-auth.img
nvmet_tcp_export $NQN /tmp/nvmet-auth.img 4422
n=/sys/kernel/config/nvmet
echo 0 > "$n/subsystems/$NQN/attr_allow_any_host"
mkdir -p "$n/hosts/$HOSTNQN"
ln -s "$n/hosts/$HOSTNQN" "$n/subsystems/$NQN/allowed_hosts/$HOSTNQN" || fail "allowing $HOSTNQN"
T="-t tcp -a 127.0.0.1 -s 4422 -n $NQN -q $HOSTNQN"
for spec in "1 hmac(sha256) null" "2 hmac(sha384) ffdhe2048" "3 hmac(sha512) ffdhe3072"; do
  set -- $spec
  hkey=$(key "$1"); ckey=$(key "$1")
  echo "$hkey" > "$n/hosts/$HOSTNQN/dhchap_key" || fail "nvmet dhchap_key"
  echo "$ckey" > "$n/hosts/$HOSTNQN/dhchap_ctrl_key" || fail "nvmet dhchap_ctrl_key"
  echo "$2" > "$n/hosts/$HOSTNQN/dhchap_hash" || fail "nvmet dhchap_hash $2"
  echo "$3" > "$n/hosts/$HOSTNQN/dhchap_dhgroup" || fail "nvmet dhchap_dhgroup $3"
  rdmablk bench $T --rw randrw --bs 4k --qd 8 --runtime 2s --verify --dhchap-secret "$hkey" \
    > /tmp/bench.log 2>&1 || { cat /tmp/bench.log; fail "bench against nvmet with $2 $3 (one-way)"; }
  rdmablk bench $T --rw randrw --bs 4k --qd 8 --runtime 2s --verify --dhchap-secret "$hkey" \
    --dhchap-ctrl-secret "$ckey" > /tmp/bench.log 2>&1 || { cat /tmp/bench.log; fail "bench against nvmet with $2 $3 (bidirectional)"; }
  say "rdmablk authenticated with nvmet: $2, $3, one-way and bidirectional"
done
wrong=$(key 1)
rdmablk bench $T --rw read --bs 4k --qd 1 --runtime 1s --dhchap-secret "$wrong" > /tmp/bench.log 2>&1 &&
  fail "nvmet accepted a wrong host secret"
grep -q "authentication" /tmp/bench.log || { cat /tmp/bench.log; fail "no authentication error from rdmablk"; }
rdmablk bench $T --rw read --bs 4k --qd 1 --runtime 1s --dhchap-secret "$hkey" --dhchap-ctrl-secret "$wrong" \
  > /tmp/bench.log 2>&1 && fail "rdmablk accepted a wrong controller secret"
grep -q "failed to prove its identity" /tmp/bench.log || { cat /tmp/bench.log; fail "no controller failure from rdmablk"; }
say "refused: a wrong host secret (by nvmet), a wrong controller secret (by rdmablk)"

# The Linux host over NVMe/RDMA to rdmablk-target, authenticated.
/usr/bin/modprobe nvme-rdma || fail "modprobe nvme-rdma"
rxe_up
RNQN=nqn.2026-11.io.rdmablk:vm-rdma-auth
rdma_run() { # HASH DHGROUP BIDIRECTIONAL
  hkey=$(key "$1"); ckey=$(key "$1")
  auth_config /tmp/rauth.toml "rdma://$RDMA_IP:4452" $RNQN $HOSTNQN "$hkey" "$ckey" "$2"
  start_target /tmp/target.log --config /tmp/rauth.toml
  extra=""; [ "$3" = both ] && extra="--dhchap-ctrl-secret=$ckey"
  /usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s 4452 -n $RNQN --hostnqn=$HOSTNQN --dhchap-secret="$hkey" $extra \
    > /tmp/connect.log 2>&1 || fail "nvme connect -t rdma (hmac $1, $2, $3): $(cat /tmp/connect.log)"
  wait_for 20 nvme_blk $RNQN || fail "no block device for $RNQN over RDMA"
  verify_blockdev "$(nvme_blk $RNQN)" 4
  say "the Linux host authenticated over NVMe/RDMA: hmac $1, $2, $3"
  /usr/bin/nvme disconnect -n $RNQN > /dev/null || fail "nvme disconnect"
  if [ "$3" = both ]; then
    wrong=$(key "$1")
    # The refusal must reach the host (AUTH_Failure1 before the
    # disconnect): a host left waiting for a command timeout blocks here
    # for minutes.
    /usr/bin/nvme connect -t rdma -a "$RDMA_IP" -s 4452 -n $RNQN --hostnqn=$HOSTNQN --dhchap-secret="$wrong" \
      > /tmp/connect.log 2>&1 &
    cpid=$!
    wait_for 30 exited $cpid || {
      echo "--- the kernel stack of nvme connect"; cat /proc/$cpid/stack
      fail "nvme connect -t rdma with a wrong host secret still runs after 30 s"
    }
    wait $cpid && fail "nvme connect -t rdma with a wrong host secret succeeded"
    sleep 1; nvme_blk $RNQN && fail "a namespace appeared over RDMA after a wrong host secret"
    say "refused over NVMe/RDMA: a wrong host secret"
  fi
  stop_target
}
rdma_run 1 null one
rdma_run 2 ffdhe2048 both
rdma_run 3 ffdhe2048 one
