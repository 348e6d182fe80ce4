# NVMe/TCP over TLS 1.3 with pre-shared keys (TP 8011) between the Linux
# host (nvme-cli 2.13 and tlshd, from trixie) and rdmablk-target on a
# tls = "required" listener: keys from `nvme gen-tls-key --insert` (the
# .nvme keyring), the same interchange key in the target's configuration;
# PSK identities of versions 0 (NVMe0R01) and 1 (NVMe1R01 ... digest); I/O
# verified; the target's status says TLS. Refused: keys that differ from
# the target's, and a plaintext connect. Discovery over TLS. nvme-cli's
# check-tls-key takes rdmablk gen-tls-key's keys.
# Trixie's libnvme (1.13) derives the retained and TLS PSKs with its old
# HKDF-Expand-Label layout (length little-endian, no length bytes before
# label and context; RFC 8446's layout came with libnvme 1.16), which is
# what it puts into .nvme: the target must be told (tls_key_legacy = true),
# and without that the same key is refused.
. /scenarios/lib.sh
NQN=nqn.2026-11.io.rdmablk:vm-tls
HOSTID=7b2e8d3f-5c4e-4f60-9bac-1d2e3f4a5b6c
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
DISC=nqn.2014-08.org.nvmexpress.discovery
PORT=4460
H="--hostnqn=$HOSTNQN --hostid=$HOSTID"
tlshd_up
/usr/bin/nvme version 2>/dev/null | head -1

# tls_config KEY [LEGACY]: the target's configuration, KEY for $HOSTNQN on
# $NQN, derived the old libnvme way unless LEGACY is false.
tls_config() {
  {
    printf '[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:%s"\ntls = "required"\n\n' $PORT
    printf '[[subsystem]]\nnqn = "%s"\n' $NQN
    printf '  [[subsystem.host]]\n  nqn = "%s"\n  tls_key = "%s"\n  tls_key_legacy = %s\n' $HOSTNQN "$1" "${2:-true}"
    printf '  [[subsystem.namespace]]\n  backend = "memory"\n  size = "64MiB"\n'
  } > /tmp/tls.toml
  chmod 600 /tmp/tls.toml
}
reload() {
  rdmablk-target reload --control /tmp/control.sock > /tmp/reload.out 2>&1 || fail "reload: $(cat /tmp/reload.out)"
}
# genkey VERSION: a new interchange key for $HOSTNQN/$NQN, its TLS PSK
# inserted into .nvme under the identity of VERSION.
genkey() {
  /usr/bin/nvme gen-tls-key --hostnqn=$HOSTNQN --subsysnqn=$NQN --identity="$1" --insert > /tmp/genkey.out 2>&1 ||
    fail "nvme gen-tls-key --identity=$1 --insert: $(cat /tmp/genkey.out)"
  key=$(grep -o 'NVMeTLSkey-1:[^ ]*' /tmp/genkey.out | head -1)
  [ -n "$key" ] || fail "nvme gen-tls-key printed no key: $(cat /tmp/genkey.out)"
}
connect_tls() {
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN $H --tls "$@" > /tmp/connect.log 2>&1
}
# io VERSION: connect over TLS, verify I/O, the identity of VERSION in the
# target's log and TLS in its status, disconnect.
io() {
  n0=$(grep -c "TLS handshake done" /tmp/target.log)
  connect_tls || fail "nvme connect --tls (identity version $1): $(cat /tmp/connect.log)"
  wait_for 20 nvme_blk $NQN || fail "no block device for $NQN over TLS (identity version $1)"
  dev=$(nvme_blk $NQN)
  verify_blockdev "$dev" 8
  grep "TLS handshake done" /tmp/target.log | tail -n +$((n0 + 1)) > /tmp/hs.txt
  [ -s /tmp/hs.txt ] || fail "the target logged no TLS handshake"
  grep -v "identity=NVMe${1}R01 $HOSTNQN $NQN" /tmp/hs.txt && fail "a queue's identity is not of version $1"
  say "$(wc -l < /tmp/hs.txt) queues handshook, e.g.: $(head -1 /tmp/hs.txt | sed 's/.*TLS handshake done //')"
  rdmablk-target status --control /tmp/control.sock > /tmp/status.out 2>&1 || fail "status: $(cat /tmp/status.out)"
  grep -q "over tcp with TLS (TLS_AES_128_GCM_SHA256, kernel)" /tmp/status.out ||
    { cat /tmp/status.out; fail "the target's status does not say TLS in the kernel"; }
  say "identity version $1: $dev, status: $(grep -o '[^,]*over tcp with TLS[^,]*' /tmp/status.out | head -1)"
  /usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect"
}

# Identity version 0 (the only key in the keyring), then version 1 (the
# kernel tries NVMe1R0x before NVMe0R0x).
genkey 0
tls_config "$key" false
TARGET_RUST_LOG=info,rdmablk_target::transport::tcp::listener=debug \
  start_target /tmp/target.log --config /tmp/tls.toml --control /tmp/control.sock
connect_tls && fail "nvme connect --tls succeeded with the key's PSK derived the RFC 8446 way (libnvme 1.13 derives the old way)"
grep -q "TLS handshake failed.*binder does not verify" /tmp/target.log || fail "the target did not log the failed binder"
say "the same key with tls_key_legacy = false: refused (the PSK binder does not verify)"
tls_config "$key"; reload
io 0
genkey 1
KEY1=$key
tls_config "$KEY1"; reload
io 1

# The keyring's keys (versions 0 and 1) differ from the target's.
/usr/bin/nvme gen-tls-key --hostnqn=$HOSTNQN --subsysnqn=$NQN > /tmp/genkey.out 2>&1 || fail "nvme gen-tls-key"
tls_config "$(grep -o 'NVMeTLSkey-1:[^ ]*' /tmp/genkey.out | head -1)"; reload
connect_tls && fail "nvme connect --tls with a key that differs from the target's succeeded"
sleep 1; nvme_blk $NQN && fail "a namespace appeared after a wrong key"
grep "TLS handshake failed" /tmp/target.log > /tmp/hsfail.txt || fail "the target did not log the failed handshake"
say "wrong key refused: nvme connect: $(tail -1 /tmp/connect.log); target: $(tail -1 /tmp/hsfail.txt | sed 's/.*connection closed: //')"

# Plaintext against the TLS-required listener.
tls_config "$KEY1"; reload
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN $H > /tmp/connect.log 2>&1 &&
  fail "a plaintext nvme connect to the tls = required listener succeeded"
sleep 1; nvme_blk $NQN && fail "a namespace appeared over plaintext"
grep -q "plaintext ICReq" /tmp/target.log || fail "the target did not log the plaintext ICReq"
say "plaintext refused: nvme connect: $(tail -1 /tmp/connect.log)"

# Discovery over TLS: the same key under the discovery NQN's identity.
/usr/bin/nvme check-tls-key --keydata="$KEY1" --hostnqn=$HOSTNQN --subsysnqn=$DISC --identity=1 --insert \
  > /tmp/checkkey.out 2>&1 || fail "nvme check-tls-key --insert for discovery: $(cat /tmp/checkkey.out)"
/usr/bin/nvme discover -t tcp -a 127.0.0.1 -s $PORT $H --tls > /tmp/discover.log 2>&1 ||
  fail "nvme discover --tls: $(cat /tmp/discover.log)"
grep -q "subnqn: *$NQN" /tmp/discover.log || { cat /tmp/discover.log; fail "nvme discover --tls does not list $NQN"; }
grep -qi "tls" /tmp/discover.log || { cat /tmp/discover.log; fail "the discovery entry does not name TLS"; }
say "discovery over TLS lists $NQN ($(grep -i 'sectype' /tmp/discover.log | head -1 | tr -s ' '))"
grep "identity=NVMe1R01 $HOSTNQN $DISC" /tmp/target.log > /dev/null || fail "no TLS handshake for discovery in the target's log"
stop_target

# rdmablk gen-tls-key's keys are nvme-cli's: check-tls-key takes them.
for hmac in 1 2; do
  ours=$(rdmablk gen-tls-key --hmac $hmac) || fail "rdmablk gen-tls-key --hmac $hmac"
  /usr/bin/nvme check-tls-key --keydata="$ours" --hostnqn=$HOSTNQN --subsysnqn=$NQN > /tmp/checkours.out 2>&1 ||
    fail "nvme check-tls-key refuses rdmablk gen-tls-key --hmac $hmac: $(cat /tmp/checkours.out)"
  say "nvme check-tls-key on rdmablk gen-tls-key --hmac $hmac: $(head -1 /tmp/checkours.out)"
done
say "tlshd: $(grep -ci 'handshake' /tmp/tlshd.log) handshake lines; dmesg: $(dmesg | grep -ci tls) TLS lines"
dmesg | grep -i "tls\|nvme" | tail -12
