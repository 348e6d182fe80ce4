# DH-HMAC-CHAP between the Linux NVMe/TCP host and rdmablk-target: keys
# from `nvme gen-dhchap-key`, one-way and bidirectional, each hash, with
# and without a DH group (the target prefers ffdhe2048, then the others,
# null last, as configured); I/O works; a wrong host secret and a wrong
# controller secret are refused and no namespace appears.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-auth
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6a1f7c2e-4b3d-4e5f-8a9b-0c1d2e3f4a5b
key() { /usr/bin/nvme gen-dhchap-key --hmac="$1" --nqn="$HOSTNQN" 2>/dev/null | tr -d '\n'; }
run() { # HASH DHGROUP BIDIRECTIONAL
  hkey=$(key "$1"); ckey=$(key "$1")
  [ -n "$hkey" ] || fail "nvme gen-dhchap-key --hmac=$1 printed nothing"
  {
    printf '[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:4450"\n\n'
    printf '[[subsystem]]\nnqn = "%s"\n' "$NQN"
    printf '  [[subsystem.host]]\n  nqn = "%s"\n  dhchap_secret = "%s"\n' "$HOSTNQN" "$hkey"
    printf '  dhchap_ctrl_secret = "%s"\n  dhchap_dhgroup = ["%s"]\n' "$ckey" "$2"
    printf '  [[subsystem.namespace]]\n  backend = "memory"\n  size = "64MiB"\n'
  } > /tmp/auth.toml
  chmod 600 /tmp/auth.toml
  start_target /tmp/target.log --config /tmp/auth.toml
  extra=""; [ "$3" = both ] && extra="--dhchap-ctrl-secret=$ckey"
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4450 -n $NQN --hostnqn=$HOSTNQN --dhchap-secret="$hkey" $extra \
    > /tmp/connect.log 2>&1 || fail "nvme connect with hmac $1, $2, $3: $(cat /tmp/connect.log)"
  wait_for 20 nvme_blk $NQN || fail "no block device for $NQN (hmac $1, $2, $3)"
  dev=$(nvme_blk $NQN)
  verify_blockdev "$dev" 4
  say "authenticated: hmac $1, $2, $3 ($dev)"
  /usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect"
  if [ "$3" = both ]; then
    wrong=$(key "$1")
    /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4450 -n $NQN --hostnqn=$HOSTNQN --dhchap-secret="$wrong" \
      > /tmp/connect.log 2>&1 && fail "nvme connect with a wrong host secret succeeded"
    sleep 1; nvme_blk $NQN && fail "a namespace appeared after a wrong host secret"
    grep -q "authentication failed" /tmp/target.log || fail "the target did not log the failure"
    /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4450 -n $NQN --hostnqn=$HOSTNQN --dhchap-secret="$hkey" \
      --dhchap-ctrl-secret="$wrong" > /tmp/connect.log 2>&1 && fail "nvme connect with a wrong controller secret succeeded"
    sleep 1; nvme_blk $NQN && fail "a namespace appeared after a wrong controller secret"
    say "refused: a wrong host secret, a wrong controller secret (hmac $1)"
  fi
  stop_target
}
run 1 null one
run 2 ffdhe2048 both
run 3 ffdhe3072 one
run 1 ffdhe2048 both
