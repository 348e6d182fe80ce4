# DH-HMAC-CHAP between the Linux NVMe/TCP host and rdmablk-target: keys
# from `nvme gen-dhchap-key`, one-way and bidirectional, each hash, with
# and without a DH group (the target prefers ffdhe2048, then the others,
# null last, as configured); I/O works; a wrong host secret and a wrong
# controller secret are refused and no namespace appears. Then
# re-authentication: the target's secret changes by reload, the host's
# through sysfs, and I/O goes on.
. /scenarios/lib.sh
/usr/bin/modprobe nvme-tcp || fail "modprobe nvme-tcp"
NQN=nqn.2026-11.io.rdmablk:vm-auth
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6a1f7c2e-4b3d-4e5f-8a9b-0c1d2e3f4a5b
key() { /usr/bin/nvme gen-dhchap-key --hmac="$1" --nqn="$HOSTNQN" 2>/dev/null | tr -d '\n'; }
run() { # HASH DHGROUP BIDIRECTIONAL
  hkey=$(key "$1"); ckey=$(key "$1")
  [ -n "$hkey" ] || fail "nvme gen-dhchap-key --hmac=$1 printed nothing"
  auth_config /tmp/auth.toml tcp://127.0.0.1:4450 $NQN $HOSTNQN "$hkey" "$ckey" "$2"
  start_target /tmp/target.log --config /tmp/auth.toml --control /tmp/control.sock
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

# Re-authentication with a new host secret, on a live controller.
hkey=$(key 1); ckey=$(key 1)
conf_key() { auth_config /tmp/auth.toml tcp://127.0.0.1:4450 $NQN $HOSTNQN "$1"; }
conf_key "$hkey"
start_target /tmp/target.log --config /tmp/auth.toml --control /tmp/control.sock
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s 4450 -n $NQN --hostnqn=$HOSTNQN --dhchap-secret="$hkey" \
  > /tmp/connect.log 2>&1 || fail "nvme connect: $(cat /tmp/connect.log)"
wait_for 20 nvme_blk $NQN || fail "no block device for $NQN"
dev=$(nvme_blk $NQN)
ctrl=""
for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn")" = $NQN ] && ctrl=$c; done
new=$(key 1)
conf_key "$new"
rdmablk-target reload --control /tmp/control.sock > /tmp/reload.out 2>&1 || fail "reload: $(cat /tmp/reload.out)"
echo "$new" > "$ctrl/dhchap_secret" || fail "writing $ctrl/dhchap_secret"
sleep 3
[ "$(cat "$ctrl/state")" = live ] || fail "$ctrl is $(cat "$ctrl/state") after re-authenticating"
grep -q "queue re-authenticated" /tmp/target.log || fail "the host did not re-authenticate"
verify_blockdev "$dev" 4
say "re-authenticated with a new secret (reload, then sysfs); I/O goes on"
/usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect"
stop_target
