#!/usr/bin/env bash
# VM suite: boots Debian's stock 6.12 kernel under QEMU (TCG) with our release
# binaries and runs named scenarios against the real Linux NVMe-oF host,
# nvmet, nbd, soft-RoCE (rdma_rxe) and (later) ublk.
#
#   tests/vm/run.sh                  # every scenario in tests/vm/scenarios/
#   tests/vm/run.sh 10-kernel-host-tcp  # only these (file names without .sh)
#
# Tools too big for the initramfs (fio and its ~80 MB of libraries) live on a
# read-only ext4 disk, build/vm-cache/tools.img, mounted at /opt/tools; the
# initramfs calls them through small wrappers (/usr/bin/fio).
#
# Environment: VM_CACHE (downloads, default build/vm-cache), VM_WORK (boot
# files and console logs, default build/vm), VM_TIMEOUT (s,
# default 1800), VM_MEM (MiB per guest, default 2048), VM_SMP (default 2),
# VM_PARALLEL (guests booted side by side, the scenarios shared among them
# by tests/vm/weights; default 2 on a machine of 2 cores or more, else 1),
# VM_MEASURE (1: the comparison scenarios run their loads long enough for
# figures, as bench/vm.sh asks; default 0, the suite's short functional runs).
# Exit status: 0 when every requested scenario passed; 1 otherwise (a scenario
# that did not run is a failure). The guests' consoles stream to stdout
# (each line marked guestN|), to build/vm/console-N.log, and at the end
# one after the other to build/vm/console.log.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${VM_CACHE:-$repo/build/vm-cache}
work=${VM_WORK:-$repo/build/vm}
timeout_s=${VM_TIMEOUT:-1800}
kpkg=linux-image-6.12-amd64

log() { echo "[vm $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  for f in "$here"/scenarios/[0-9]*.sh; do scenarios+=("$(basename "$f" .sh)"); done
fi
for s in "${scenarios[@]}"; do
  [ -f "$here/scenarios/$s.sh" ] || die "no scenario $s (see tests/vm/scenarios/)"
done

for b in rdmablk-target rdmablk blkload rdma_stall rdma_keys hold_queues; do
  [ -x "$repo/build/release/$b" ] || die "build/release/$b missing: run cargo build --release first"
done

# ---------------------------------------------------------------- host tools
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
PATH=$PATH:/usr/sbin:/sbin # mke2fs
if ! command -v qemu-system-x86_64 >/dev/null || [ ! -x /bin/busybox ] || ! command -v cpio >/dev/null ||
   ! command -v mke2fs >/dev/null; then
  bash "$repo/scripts/setup.sh" --test
fi

# ---------------------------------------------------------------- downloads (cached)
# RDMA: libibverbs/librdmacm, the rxe and siw providers, perftest. fio goes
# to the tools disk, not the initramfs.
guest_pkgs="kmod nvme-cli nbd-client e2fsprogs iproute2 libibverbs1 librdmacm1 ibverbs-providers perftest fio"
# The closure of guest_pkgs is cut down to these (perl, python, PAM etc. not needed).
keep_re='^(lib|kmod|nvme-cli|nbd-client|e2fsprogs|iproute2|zlib|ibverbs-providers|perftest|fio)'
drop_re='^lib.*-perl$|^libperl|^libpam|^libsemanage|^libdb5|^libgdbm|^libpython'
mkdir -p "$cache/debs" "$work"
# A new package list or filter downloads again.
stamp="$cache/debs/.complete-$(echo "$kpkg $guest_pkgs $keep_re $drop_re" | md5sum | cut -c1-8)"
if [ ! -f "$stamp" ]; then
  log "downloading the kernel and guest packages into $cache"
  $SUDO apt-get update -qq
  kimg=$(apt-cache depends "$kpkg" | awk '/Depends: linux-image-/{print $2; exit}')
  [ -n "$kimg" ] || die "cannot resolve $kpkg"
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances $guest_pkgs | grep '^[a-z]' | sort -u |
         grep -E "$keep_re" | grep -vE "$drop_re")
  (cd "$cache/debs" && apt-get download -q "$kimg" $pkgs >/dev/null 2>&1) || die "apt-get download failed"
  echo "$kimg" > "$cache/debs/kernel-package"
  touch "$stamp"
fi
kimg=$(cat "$cache/debs/kernel-package")

# NVMe/TCP over TLS (scenarios 19, 21) needs tlshd (ktls-utils: not in
# bookworm) and an nvme-cli with --tls and gen-tls-key --insert (bookworm's
# 2.3 has neither), with keyctl to look at the keyrings: these come from
# Debian 13 trixie with their trixie dependency closure, through a private
# apt configuration and package lists under $cache/trixie-apt (the
# machine's apt sources and lists stay as they are).
trixie_pkgs="nvme-cli ktls-utils keyutils"
trixie_keep_re='^(lib|nvme-cli|ktls-utils|keyutils|zlib1g)'
trixie_drop_re='^libpam|^libsemanage|^libdb5|^libsystemd-shared|^libdebconf|^libdebian-installer|^libnewt|^libslang|^libtextwrap|^libapparmor|^libseccomp'
mkdir -p "$cache/debs-trixie"
tstamp="$cache/debs-trixie/.complete-$(echo "$trixie_pkgs $trixie_keep_re $trixie_drop_re" | md5sum | cut -c1-8)"
if [ ! -f "$tstamp" ]; then
  log "downloading from trixie into $cache/debs-trixie: $trixie_pkgs"
  ta=$cache/trixie-apt
  mkdir -p "$ta/lists/partial" "$ta/cache/archives/partial" "$ta/empty"
  printf '%s\n' "deb http://deb.debian.org/debian trixie main" \
    "deb http://deb.debian.org/debian-security trixie-security main" > "$ta/sources.list"
  tapt=(-o Dir::Etc::sourcelist="$ta/sources.list" -o Dir::Etc::sourceparts="$ta/empty"
        -o Dir::Etc::preferences="$ta/empty/none" -o Dir::Etc::preferencesparts="$ta/empty"
        -o Dir::State::Lists="$ta/lists" -o Dir::Cache="$ta/cache" -o APT::Get::List-Cleanup=0)
  apt-get "${tapt[@]}" update -qq || die "apt-get update of the trixie lists failed"
  tpkgs=$(apt-cache "${tapt[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
            --no-replaces --no-enhances $trixie_pkgs | grep '^[a-z]' | sort -u |
          grep -E "$trixie_keep_re" | grep -vE "$trixie_drop_re")
  rm -f "$cache"/debs-trixie/*.deb
  (cd "$cache/debs-trixie" && apt-get "${tapt[@]}" download -q $tpkgs >/dev/null 2>&1) ||
    die "apt-get download from trixie failed ($tpkgs)"
  touch "$tstamp"
fi
kver=${kimg#linux-image-}

# ---------------------------------------------------------------- sysroot
sr=$cache/sysroot
if [ ! -f "$sr/.complete" ] || [ "$stamp" -nt "$sr/.complete" ]; then
  rm -rf "$sr"; mkdir -p "$sr"
  for d in "$cache"/debs/*.deb; do dpkg -x "$d" "$sr"; done
  touch "$sr/.complete"
fi
srlib="$sr/usr/lib/x86_64-linux-gnu:$sr/lib/x86_64-linux-gnu"
kroot=$sr
moddir=$kroot/lib/modules/$kver
# kmod picks its command from the name it is called by.
mkdir -p "$cache/hosttools"
for t in modinfo depmod; do ln -sf "$sr/bin/kmod" "$cache/hosttools/$t"; done
[ -f "$moddir/modules.dep" ] || LD_LIBRARY_PATH="$srlib" "$cache/hosttools/depmod" -b "$kroot" "$kver"
[ -d "$moddir" ] || die "kernel modules for $kver not found"
find_in() { local p; for p in usr/sbin usr/bin sbin bin; do [ -f "$1/$p/$2" ] && [ ! -L "$1/$p/$2" ] && { echo "$1/$p/$2"; return; }; done; die "$2 not in the guest packages"; }
find_sr() { find_in "$sr" "$1"; }

# The guest's sysroot: the bookworm one with the trixie packages unpacked
# over it (trixie's glibc runs bookworm's programs too). Bookworm keeps
# some libraries and programs in /lib, /bin and /sbin, trixie only in /usr:
# the bookworm copy of anything trixie also has becomes a link to trixie's.
# The tools disk and the host-side kmod keep the bookworm-only sysroot.
gsr=$cache/sysroot-trixie
gkey="$(basename "$stamp") $(basename "$tstamp")"
if [ "$(cat "$gsr/.complete" 2>/dev/null)" != "$gkey" ] || [ "$sr/.complete" -nt "$gsr/.complete" ]; then
  log "building the guest sysroot $gsr (bookworm + trixie)"
  rm -rf "$gsr"
  gtmp=$(mktemp -d "$cache/sysroot-trixie.XXXXXX"); tx=$gtmp/trixie; mkdir "$gtmp/root" "$tx"
  # (without the kernel: modules and the kernel image come from $sr)
  (cd "$sr" && tar cf - --exclude=./lib/modules --exclude=./boot --exclude=./.complete .) | (cd "$gtmp/root" && tar xf -)
  for d in "$cache"/debs-trixie/*.deb; do dpkg -x "$d" "$tx"; done
  cp -a --remove-destination "$tx/." "$gtmp/root/"
  for d in lib/x86_64-linux-gnu bin sbin; do
    up=..; [ "$d" = lib/x86_64-linux-gnu ] && up=../..
    for f in "$tx/usr/$d"/*; do
      n=${f##*/}
      if [ -e "$gtmp/root/$d/$n" ] || [ -L "$gtmp/root/$d/$n" ]; then
        rm -f "$gtmp/root/$d/$n"; ln -s "$up/usr/$d/$n" "$gtmp/root/$d/$n"
      fi
    done
  done
  echo "$gkey" > "$gtmp/root/.complete"
  mv "$gtmp/root" "$gsr"; rm -rf "$gtmp"
fi
gsrlib="$gsr/usr/lib/x86_64-linux-gnu:$gsr/lib/x86_64-linux-gnu"
gldso=$gsr/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
[ -x "$gldso" ] || die "no dynamic loader in $gsr"
find_gsr() { find_in "$gsr" "$1"; }

# ---------------------------------------------------------------- tools disk (cached)
# tools_bins with every library they need, all from the sysroot, plus the
# sysroot's dynamic loader that the initramfs wrappers run them with:
# bin/NAME, lib/*. Rebuilt when the packages or this list change.
tools_bins="fio"
tools_img=$cache/tools.img
tools_key="layout 1, $tools_bins, $(basename "$stamp")"
if [ ! -f "$tools_img" ] || [ "$sr/.complete" -nt "$tools_img" ] ||
   [ "$(cat "$tools_img.key" 2>/dev/null)" != "$tools_key" ]; then
  log "building $tools_img ($tools_bins)"
  td=$(mktemp -d "$cache/tools.d.XXXXXX") # private: runs may share the cache
  mkdir -p "$td/bin" "$td/lib"
  ldso=$sr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
  cp -L "$ldso" "$td/lib/"
  for b in $tools_bins; do
    src=$(find_sr "$b")
    cp -L "$src" "$td/bin/$b"
    # librados finds libceph-common through its RUNPATH, which is not in srlib.
    out=$("$ldso" --library-path "$srlib:$sr/usr/lib/x86_64-linux-gnu/ceph" --list "$src" 2>&1) || true
    echo "$out" | grep -q 'not found' && { echo "$out" >&2; die "unresolved libraries for $b"; }
    for path in $(echo "$out" | awk '/=> \//{print $3}'); do
      case "$path" in "$sr"/*) ;; *) die "$b: $path is not from the guest packages";; esac
      cp -L "$path" "$td/lib/"
    done
  done
  mb=$(( $(du -sm "$td" | cut -f1) * 11 / 10 + 8 ))
  truncate -s "${mb}M" "$td.img"
  mke2fs -q -t ext4 -O ^has_journal -m 0 -L rdmablk-tools -d "$td" "$td.img" ||
    die "mke2fs of the tools disk failed"
  mv "$td.img" "$tools_img"
  echo "$tools_key" > "$tools_img.key"
  rm -rf "$td"
fi

# ---------------------------------------------------------------- initramfs
ir=$work/initramfs
rm -rf "$ir"
mkdir -p "$ir"/{usr/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,mnt,opt/tools,scenarios}
ln -s usr/bin "$ir/bin"; ln -s usr/bin "$ir/sbin"; ln -s usr/lib "$ir/lib"; ln -s usr/lib64 "$ir/lib64"
cp /bin/busybox "$ir/usr/bin/busybox"
for a in $(/bin/busybox --list); do [ -e "$ir/usr/bin/$a" ] || ln -s busybox "$ir/usr/bin/$a"; done

copy_deps() { # ELF file: copy the libraries it needs from the guest sysroot
  local out
  out=$("$gldso" --library-path "$gsrlib" --list "$1" 2>&1) || true
  echo "$out" | grep -q 'not found' && { echo "$out" >&2; die "unresolved libraries for $1"; }
  echo "$out" | awk '$1 !~ /^\// && /=> \//{print $1, $3}' | while read -r name path; do
    case "$path" in "$gsr"/*) ;; *) alt=$(ls "$gsr"/{usr/,}lib/x86_64-linux-gnu/"$name" 2>/dev/null | head -1 || true); [ -n "$alt" ] && path=$alt ;; esac
    [ -e "$ir/usr/lib/x86_64-linux-gnu/$name" ] || cp -L "$path" "$ir/usr/lib/x86_64-linux-gnu/$name"
  done
  [ -e "$ir/usr/lib64/ld-linux-x86-64.so.2" ] || cp -L "$gldso" "$ir/usr/lib64/"
}
add_bin() { # source path, name in the guest
  rm -f "$ir/usr/bin/$2"; cp -L "$1" "$ir/usr/bin/$2"; copy_deps "$1"
}

add_bin "$(find_gsr kmod)" kmod
for a in modprobe insmod lsmod rmmod depmod modinfo; do ln -sf kmod "$ir/usr/bin/$a"; done
for b in nvme nbd-client mke2fs ip ss rdma ib_write_bw ib_read_bw tlshd keyctl; do add_bin "$(find_gsr $b)" "$b"; done
# tlshd (TLS handshakes for the kernel's NVMe/TCP host and nvmet): its PSKs
# are in the .nvme keyring, which it links into its session keyring.
mkdir -p "$ir/etc/tlshd"
printf '[debug]\nloglevel=1\ntls=0\nnl=0\n\n[authenticate]\nkeyrings=.nvme\n' > "$ir/etc/tlshd/config"
cp "$ir/etc/tlshd/config" "$ir/etc/tlshd.conf"
# libibverbs dlopen()s its providers: rxe (soft-RoCE) and siw (soft-iWARP).
mkdir -p "$ir/usr/lib/x86_64-linux-gnu/libibverbs" "$ir/etc/libibverbs.d"
for prov in rxe siw; do
  for f in "$gsr"/usr/lib/x86_64-linux-gnu/libibverbs/lib$prov-rdmav*.so; do
    [ -f "$f" ] || die "libibverbs provider $prov not in the guest packages"
    cp -L "$f" "$ir/usr/lib/x86_64-linux-gnu/libibverbs/"; copy_deps "$f"
  done
  cp "$gsr/etc/libibverbs.d/$prov.driver" "$ir/etc/libibverbs.d/"
done
for b in rdmablk-target rdmablk blkload rdma_stall rdma_keys hold_queues; do
  add_bin "$repo/build/release/$b" "$b"
  strip --strip-debug "$ir/usr/bin/$b" 2>/dev/null || true
done
# Tools disk programs: run with the disk's own loader and libraries (no global
# LD_LIBRARY_PATH); a clear message when the disk is not mounted.
for b in $tools_bins; do
  rm -f "$ir/usr/bin/$b"
  cat > "$ir/usr/bin/$b" <<EOF_WRAP
#!/bin/sh
t=/opt/tools
[ -x \$t/bin/$b ] || { echo "$b: the tools disk is not mounted at \$t (tests/vm/run.sh attaches build/vm-cache/tools.img)" >&2; exit 127; }
exec \$t/lib/ld-linux-x86-64.so.2 --library-path \$t/lib --argv0 $b \$t/bin/$b "\$@"
EOF_WRAP
  chmod +x "$ir/usr/bin/$b"
done
copy_lib_gcc=$(ls "$gsr"/{usr/,}lib/x86_64-linux-gnu/libgcc_s.so.1 2>/dev/null | head -1 || true)
[ -n "$copy_lib_gcc" ] && cp -L "$copy_lib_gcc" "$ir/usr/lib/x86_64-linux-gnu/"

# Kernel modules with their dependencies; depmod so modprobe works.
# rdma_rxe needs the crc32 shash (crc32_generic); siw is not built in Debian's
# 6.12 (CONFIG_RDMA_SIW unset) and is skipped there. tcp_diag lets ss -K cut
# TCP connections (CONFIG_INET_DIAG_DESTROY). kTLS (tls) takes its ciphers
# from the crypto API: gcm(aes) and the others TLS 1.3 may negotiate.
want="nvme-tcp nvme-fabrics nvmet nvmet-tcp nbd ext4 loop configfs crc32c_generic crc32c-intel virtio_net virtio_blk
  rdma_rxe siw rdma_ucm ib_uverbs ib_umad nvme-rdma nvmet-rdma crc32_generic ublk_drv
  tcp_diag tls gcm ghash-generic ghash-clmulni-intel aesni-intel ccm chacha20poly1305"
declare -A have=()
queue=()
for m in $want; do
  f=$(LD_LIBRARY_PATH="$srlib" "$cache/hosttools/modinfo" -b "$kroot" -k "$kver" -n "$m" 2>/dev/null) || { log "module $m: not in $kver"; continue; }
  for ff in $f; do case "$ff" in /*) queue+=("${ff#$moddir/}");; esac; done
done
while [ ${#queue[@]} -gt 0 ]; do
  rel=${queue[0]}; queue=("${queue[@]:1}")
  [ -n "${have[$rel]:-}" ] && continue
  have[$rel]=1
  mkdir -p "$ir/lib/modules/$kver/$(dirname "$rel")"
  cp "$moddir/$rel" "$ir/lib/modules/$kver/$rel"
  for d in $(grep "^$rel:" "$moddir/modules.dep" | cut -d: -f2-); do queue+=("$d"); done
done
cp "$moddir"/modules.builtin* "$moddir"/modules.order "$ir/lib/modules/$kver/" 2>/dev/null || true
LD_LIBRARY_PATH="$srlib" "$cache/hosttools/depmod" -b "$ir" "$kver"

cp "$here"/scenarios/*.sh "$ir/scenarios/"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$ir/etc/passwd"
printf '127.0.0.1 localhost\n' > "$ir/etc/hosts"
# ---------------------------------------------------------------- VMs
# The scenarios are shared among VM_PARALLEL guests booted side by side
# (single-threaded TCG keeps one host core busy each), longest first to the
# guest with the least work, by the seconds tests/vm/weights gives (10 for a
# scenario it does not name). Each guest has its own initramfs (the same
# tree, its own /init) and console log.
parallel=${VM_PARALLEL:-$(( $(nproc) >= 2 ? 2 : 1 ))}
[ "$parallel" -ge 1 ] || die "VM_PARALLEL must be at least 1"
[ "$parallel" -le ${#scenarios[@]} ] || parallel=${#scenarios[@]}
weight() { awk -v s="$1" '$1==s {print $2; f=1} END {if (!f) print 10}' "$here/weights"; }
declare -a groups loads
for ((g = 0; g < parallel; g++)); do groups[g]=""; loads[g]=0; done
while read -r w s; do
  least=0
  for ((g = 1; g < parallel; g++)); do [ "${loads[g]}" -lt "${loads[least]}" ] && least=$g; done
  groups[least]="${groups[least]} $s"; loads[least]=$(( ${loads[least]} + w ))
done < <(for s in "${scenarios[@]}"; do echo "$(weight "$s") $s"; done | sort -k1,1nr -k2,2)

for ((g = 0; g < parallel; g++)); do
  group=${groups[g]# }
  cat > "$ir/init" <<EOF_INIT
#!/bin/sh
export PATH=/usr/bin MEASURE=${VM_MEASURE:-0}
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts
mount -t tmpfs -o size=1200m tmpfs /tmp; mount -t tmpfs tmpfs /run
mount -t configfs configfs /sys/kernel/config 2>/dev/null
/usr/bin/ip link set lo up
/usr/bin/modprobe virtio_net 2>/dev/null
if /usr/bin/ip link show eth0 >/dev/null 2>&1; then
  /usr/bin/ip link set eth0 up; /usr/bin/ip addr add 10.0.2.15/24 dev eth0
fi
mkdir -p /etc/nvme; echo nqn.2014-08.org.nvmexpress:uuid:5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f60 > /etc/nvme/hostnqn
echo 5f0c3a52-3f1e-4c2a-9a57-1b2d3c4e5f60 > /etc/nvme/hostid
# The tools disk: the virtio disk with serial rdmablk-tools, read-only.
/usr/bin/modprobe virtio_blk 2>/dev/null; /usr/bin/modprobe ext4 2>/dev/null
for b in /sys/block/vd*; do
  [ "\$(cat \$b/serial 2>/dev/null)" = rdmablk-tools ] && mount -t ext4 -o ro /dev/\${b##*/} /opt/tools
done
grep -q " /opt/tools " /proc/mounts || echo "WARNING: no tools disk at /opt/tools (fio unavailable)"
echo "VM-BOOTED kernel \$(uname -r)"
for s in $group; do
  echo "SCENARIO-BEGIN \$s"
  start=\$(cut -d' ' -f1 /proc/uptime)
  if (cd /tmp && sh /scenarios/\$s.sh); then echo "SCENARIO-PASS \$s"; else echo "SCENARIO-FAIL \$s (exit \$?)"; fi
  echo "SCENARIO-TIME \$s \$start \$(cut -d' ' -f1 /proc/uptime)"
done
echo VM-ALL-DONE
sync
poweroff -f
EOF_INIT
  chmod +x "$ir/init"
  (cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$work/initramfs-$g.gz"
  log "guest $g: initramfs $(du -h "$work/initramfs-$g.gz" | cut -f1), about ${loads[g]} s of scenarios: $group"
done

# boot G: boots guest G with its initramfs, its console in console-G.log.
# Single-threaded TCG: as fast here as multi-threaded, and free of its races
# with kernel code patching (seen once as an int3 Oops at boot). A guest
# kernel that panics is booted again, twice at most; a scenario that fails
# is not retried.
boot() {
  local g=$1 console=$work/console-$1.log attempt start rc
  for attempt in 1 2 3; do
    start=$(date +%s)
    set +e
    timeout "$timeout_s" qemu-system-x86_64 -accel "tcg,thread=${VM_TCG_THREAD:-single}" -cpu max \
      -m "${VM_MEM:-2048}" -smp "${VM_SMP:-2}" \
      -kernel "$kroot/boot/vmlinuz-$kver" -initrd "$work/initramfs-$g.gz" \
      -append "console=ttyS0 panic=-1 loglevel=4" -nographic -no-reboot -serial mon:stdio \
      -nic user,model=virtio-net-pci \
      -drive "file=$tools_img,format=raw,if=none,id=tools,readonly=on" -device virtio-blk-pci,drive=tools,serial=rdmablk-tools \
      </dev/null 2>&1 | tr -d '\r' | tee "$console" | sed -u "s/^/  guest$g| /"
    rc=${PIPESTATUS[0]}
    set -e
    log "guest $g: VM wall time: $(( $(date +%s) - start )) s (qemu exit $rc)"
    [ "$rc" -eq 124 ] && log "guest $g hit the ${timeout_s}s timeout"
    if grep -q "Kernel panic" "$console" && ! grep -q "^SCENARIO-FAIL" "$console" && [ $attempt -lt 3 ]; then
      cp "$console" "$work/console-$g-panic-$attempt.log"
      log "guest $g: the kernel panicked (kept in console-$g-panic-$attempt.log); booting again"
      continue
    fi
    break
  done
}
start=$(date +%s)
pids=()
for ((g = 0; g < parallel; g++)); do boot "$g" & pids+=($!); done
wait "${pids[@]}" || true
log "VM suite wall time: $(( $(date +%s) - start )) s with $parallel guest(s)"
# One log of every guest, guest after guest, as a single guest would write it.
for ((g = 0; g < parallel; g++)); do cat "$work/console-$g.log"; done > "$work/console.log"

# ---------------------------------------------------------------- verdict
fail=0
for ((g = 0; g < parallel; g++)); do
  console=$work/console-$g.log
  for s in ${groups[g]}; do
    if grep -q "^SCENARIO-PASS $s\$" "$console"; then
      t=$(awk -v s="$s" '$1=="SCENARIO-TIME" && $2==s {printf "%.0f", $4-$3}' "$console")
      echo "PASS $s (${t}s in guest $g)"
    elif grep -q "^SCENARIO-FAIL $s" "$console"; then
      echo "FAIL $s"; fail=1
      echo "---- evidence from guest $g ----"
      awk -v s="$s" '$0=="SCENARIO-BEGIN " s {on=1} on {print "  " $0} /^SCENARIO-(PASS|FAIL) / && on && index($0, s) {exit}' "$console" | tail -60
    else
      echo "FAIL $s (did not run: guest $g stopped before it; see $console)"; fail=1
    fi
  done
  grep -q '^VM-ALL-DONE' "$console" || { echo "FAIL: guest $g did not finish"; fail=1; }
done
exit $fail
