# rdmablk host -> Linux nvmet-tcp over TLS 1.3 with pre-shared keys: an
# nvmet port that requires TLS (addr_tsas tls1.3), one interchange key from
# `nvme gen-tls-key` put into .nvme under the identities of versions 0 and
# 1 and the discovery NQN's (tlshd does nvmet's handshakes with them).
# First the kernel host on that port, as a control; then rdmablk discover
# --tls, bench --verify --tls with identity versions 0 and 1, a wrong key
# and plaintext refused, and an NBD export over TLS verified with fio
# through the kernel's nbd client; rdmablk's I/O queues hand their TLS to
# the kernel. Trixie's libnvme (1.13) derives the PSKs the old way:
# rdmablk is given --tls-compat.

. /scenarios/lib.sh
NQN=nqn.2026-11.io.rdmablk:vm-nvmet-tls
HOSTID=8c3f9e40-6d5f-4071-8cbd-2e3f4a5b6c7d
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID
DISC=nqn.2014-08.org.nvmexpress.discovery
PORT=4426
tlshd_up

/usr/bin/nvme gen-tls-key --hostnqn=$HOSTNQN --subsysnqn=$NQN > /tmp/genkey.out 2>&1 || fail "nvme gen-tls-key: $(cat /tmp/genkey.out)"
KEY=$(grep -o 'NVMeTLSkey-1:[^ ]*' /tmp/genkey.out | head -1)
[ -n "$KEY" ] || fail "nvme gen-tls-key printed no key"
for id in "$NQN 0" "$NQN 1" "$DISC 1"; do
  /usr/bin/nvme check-tls-key --keydata="$KEY" --hostnqn=$HOSTNQN --subsysnqn=${id% *} --identity=${id#* } --insert \
    > /tmp/checkkey.out 2>&1 || fail "nvme check-tls-key --insert ($id): $(cat /tmp/checkkey.out)"
done
say "key inserted into .nvme for $NQN (identities 0 and 1) and discovery"
truncate -s 256M /tmp/nvmet-tls.img
nvmet_tcp_export $NQN /tmp/nvmet-tls.img $PORT tls
say "nvmet port $PORT: tsas $(cat /sys/kernel/config/nvmet/ports/$PORT/addr_tsas), treq $(cat /sys/kernel/config/nvmet/ports/$PORT/addr_treq)"

# The control: the kernel host, through the same tlshd and keyring.
/usr/bin/nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN --hostnqn=$HOSTNQN --hostid=$HOSTID --tls \
  > /tmp/connect.log 2>&1 || fail "the kernel host's nvme connect --tls to nvmet: $(cat /tmp/connect.log)"
wait_for 20 nvme_blk $NQN || fail "no block device from nvmet over TLS"
verify_blockdev "$(nvme_blk $NQN)" 4
/usr/bin/nvme disconnect -n $NQN > /dev/null || fail "nvme disconnect"
say "control: the kernel host reads and writes nvmet over TLS"

T="-t tcp -a 127.0.0.1 -s $PORT -q $HOSTNQN -I $HOSTID"
TLS="--tls --tls-key $KEY --tls-compat"
rdmablk discover $T $TLS --tls-identity 1 > /tmp/discover.log 2>&1 || fail "rdmablk discover --tls: $(cat /tmp/discover.log)"
grep -q "subnqn:  $NQN" /tmp/discover.log || { cat /tmp/discover.log; fail "rdmablk discover --tls does not list $NQN"; }
say "rdmablk discover --tls lists $NQN"
for v in 0 1; do
  rdmablk bench $T -n $NQN $TLS --tls-identity $v --rw randrw --bs 4k --qd 16 --runtime 2s --verify \
    > /tmp/bench.log 2>&1 || fail "rdmablk bench --tls --tls-identity $v --verify against nvmet: $(tail -5 /tmp/bench.log)"
  tail -2 /tmp/bench.log
  say "rdmablk bench --verify over TLS, identity version $v"
done
rdmablk bench $T -n $NQN $TLS --tls-identity 1 --rw write --bs 1m --qd 4 --runtime 2s --verify \
  --log-level debug > /tmp/bench2.log 2>&1 || fail "rdmablk bench --tls --verify with 1 MiB: $(tail -5 /tmp/bench2.log)"
grep -q "the queue's TLS goes to the kernel" /tmp/bench2.log ||
  fail "rdmablk's I/O queues did not hand their TLS to the kernel: $(grep -m1 'TLS in user space' /tmp/bench2.log)"
say "rdmablk's I/O queues encrypt in kernel TLS"

# Refused: a key nvmet does not have, and plaintext.
/usr/bin/nvme gen-tls-key --hostnqn=$HOSTNQN --subsysnqn=$NQN > /tmp/genkey.out 2>&1 || fail "nvme gen-tls-key"
WRONG=$(grep -o 'NVMeTLSkey-1:[^ ]*' /tmp/genkey.out | head -1)
rdmablk bench $T -n $NQN --tls --tls-key "$WRONG" --tls-compat --tls-identity 1 --rw read --bs 4k --qd 1 --runtime 1s \
  > /tmp/bench-wrong.log 2>&1 && fail "rdmablk bench --tls with a key nvmet does not have succeeded"
say "wrong key refused: $(tail -1 /tmp/bench-wrong.log)"
rdmablk bench $T -n $NQN --rw read --bs 4k --qd 1 --runtime 1s > /tmp/bench-plain.log 2>&1 &&
  fail "rdmablk bench without --tls against nvmet's TLS port succeeded"
say "plaintext refused: $(tail -1 /tmp/bench-plain.log)"

# An NBD export over TLS, verified with fio through the kernel's nbd client.
/usr/bin/modprobe nbd || fail "modprobe nbd"
: > /tmp/connect.out
rdmablk connect $T -n $NQN $TLS --tls-identity 1 --nbd unix:/tmp/nvmet-tls.sock > /tmp/connect.out 2> /tmp/connect.log &
CPID=$!
wait_for 30 grep -q "^ready: " /tmp/connect.out || fail "rdmablk connect --tls did not become ready"
/usr/bin/nbd-client -unix /tmp/nvmet-tls.sock /dev/nbd0 -b 4096 || fail "nbd-client"
fio_verify /dev/nbd0 32M
/usr/bin/nbd-client -d /dev/nbd0
kill -TERM $CPID; wait $CPID || fail "rdmablk connect --tls exited non-zero"
say "tlshd handshakes: $(grep -c 'Handshake with' /tmp/tlshd.log) ($(grep -c 'Handshake with.*failed' /tmp/tlshd.log) failed, as the refusals above)"
say "rdmablk host against nvmet-tcp over TLS: all checks passed"
