# The Linux host (tlshd, kernel TLS) against rdmablk-target over TLS,
# against the same pair in plaintext, in one boot: 4 KiB random read QD 32
# and 128 KiB read QD 8 on /dev/nvmeXnY (blkload, O_DIRECT), with the
# target's records in kernel TLS, then in user space (RDMABLK_KTLS=0), then
# plaintext. Each load must run and move data; the figures are bench/vm.sh's
# (VM_MEASURE=1: 8 and 5 s loads; here 1 s).
. /scenarios/lib.sh
NQN=nqn.2026-11.io.rdmablk:vm-tls-compare
HOSTID=5d3c2b1a-9e8f-4a7b-8c6d-0e1f2a3b4c5d
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
H="--hostnqn=$HOSTNQN --hostid=$HOSTID"
tlshd_up
/usr/bin/nvme gen-tls-key --hostnqn=$HOSTNQN --subsysnqn=$NQN --identity=0 --insert > /tmp/genkey.out 2>&1 ||
  fail "nvme gen-tls-key --insert: $(cat /tmp/genkey.out)"
key=$(grep -o 'NVMeTLSkey-1:[^ ]*' /tmp/genkey.out | head -1)
# Trixie's libnvme derives the old way: tls_key_legacy (see 19-kernel-host-tls).
{
  printf '[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:4470"\ntls = "required"\n\n'
  printf '[[listener]]\ntransport = "tcp"\naddress = "127.0.0.1:4471"\n\n'
  printf '[[subsystem]]\nnqn = "%s"\nallow_any_host = true\n' $NQN
  printf '  [[subsystem.host]]\n  nqn = "%s"\n  tls_key = "%s"\n  tls_key_legacy = true\n' $HOSTNQN "$key"
  printf '  [[subsystem.namespace]]\n  backend = "memory"\n  size = "256MiB"\n'
} > /tmp/tls.toml
chmod 600 /tmp/tls.toml
# load NAME PORT [--tls]: connect, fill, run both loads, disconnect.
load() {
  /usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $2 -n $NQN $H -i 1 $3 > /tmp/connect.log 2>&1 ||
    fail "nvme connect ($1): $(cat /tmp/connect.log)"
  wait_for 20 nvme_blk $NQN || fail "no block device ($1)"
  dev=$(nvme_blk $NQN)
  dd if=/dev/zero of=$dev bs=1M count="$(suite_or_bench 8 64)" oflag=direct 2>/dev/null
  blkload $dev --rw randread --bs 4k --qd 32 --runtime "$(suite_or_bench 1 8)s" > /tmp/rand-$1.txt || fail "blkload $1"
  blkload $dev --rw read --bs 128k --qd 8 --runtime "$(suite_or_bench 1 5)s" > /tmp/seq-$1.txt || fail "blkload seq $1"
  /usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect ($1)"
}
export TARGET_RUST_LOG=info,rdmablk_target::transport::tcp::listener=debug
start_target /tmp/target.log --config /tmp/tls.toml
load kernel-tls 4470 --tls
grep -q "TLS handshake done.*kernel=true" /tmp/target.log || fail "the target did not use kernel TLS"
load plaintext 4471
stop_target
RDMABLK_KTLS=0 start_target /tmp/target-user.log --config /tmp/tls.toml
load user-tls 4470 --tls
grep -q "TLS handshake done.*kernel=false" /tmp/target-user.log || fail "RDMABLK_KTLS=0 did not keep records in user space"
stop_target
for load in rand seq; do
  [ $load = rand ] && what=randread-4k-qd32 || what=read-128k-qd8
  compare tls-kernel-$what kernel-tls /tmp/$load-kernel-tls.txt
  compare tls-kernel-$what plaintext /tmp/$load-plaintext.txt
  compare tls-user-$what user-tls /tmp/$load-user-tls.txt
  compare tls-user-$what plaintext /tmp/$load-plaintext.txt
done
say "kernel host over TLS (kernel TLS, then user-space records on the target) and in plaintext: every load moved data"
