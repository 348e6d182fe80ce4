#!/usr/bin/env bash
# The Debian packages, as an operator meets them: built by scripts/deb.sh,
# checked by lintian (no error or warning), their units rated by
# `systemd-analyze security` (the exposure printed, and held to what it is
# today), their man pages rendered by man(1) without a warning, their bash
# completions driven through bash-completion's loader; then installed with
# dpkg in a container booted by systemd (systemd-nspawn on an overlay of
# this machine's root, so nothing here changes): `rdmablk-target --check`
# on the installed default, the hardened unit started by systemctl, the
# installed `rdmablk bench` against it, a reload and a stop through the
# unit, and `dpkg -r` removing everything but the configuration.
#
#   tests/package/run.sh            # needs root; scripts/setup.sh --package
#   SKIP_BUILD=1 tests/package/run.sh   # the debs already in build/deb
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

log() { echo "[package $(date +%T)] $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# Exposure levels (systemd-analyze's scale times 10) the units may not
# exceed: what they are today.
declare -A EXPOSURE_MAX=([rdmablk-target.service]=25 [rdmablk-connect@.service]=28)

[ "$(id -u)" -eq 0 ] || die "needs root (dpkg and systemd-nspawn)"
bash scripts/setup.sh --package
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/deb.sh >/dev/null
version=$(dpkg-parsechangelog -S Version)
debs=(build/deb/rdmablk-target_"${version}"_amd64.deb build/deb/rdmablk_"${version}"_amd64.deb)
for d in "${debs[@]}"; do [ -f "$d" ] || die "$d missing"; done

work=$(mktemp -d /tmp/rdmablk-package.XXXXXX)
leader=""
nspawn=""
cleanup() {
  if [ -n "$nspawn" ] && kill -0 "$nspawn" 2>/dev/null; then
    kill -TERM "$nspawn" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nspawn" 2>/dev/null || true
  fi
  umount "$work/ov/root" 2>/dev/null || true
  umount "$work/ov" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# ---------------------------------------------------------------- lintian
log "lintian"
lintian --fail-on error,warning --display-info "${debs[@]}" 2>&1 | grep -v '^running with root' || true
lintian --fail-on error,warning "${debs[@]}" >/dev/null 2>&1 || die "lintian reports an error or a warning (above)"

# ---------------------------------------------------------------- files
dpkg-deb -x "${debs[0]}" "$work/files"
dpkg-deb -x "${debs[1]}" "$work/files"
f=$work/files
for b in rdmablk-target rdmablk; do
  "$f/usr/bin/$b" --version | grep -Eq "^$b $version \(commit [0-9a-f]{12}\)$" ||
    die "$b --version does not name the version and commit: $("$f/usr/bin/$b" --version)"
done
dpkg-deb -f "${debs[0]}" Conffiles 2>/dev/null | grep -q /etc/rdmablk/target.toml ||
  dpkg-deb -I "${debs[0]}" conffiles | grep -qx /etc/rdmablk/target.toml ||
  die "/etc/rdmablk/target.toml is not a conffile"

# ---------------------------------------------------------------- units
for u in "$f"/lib/systemd/system/*.service; do
  name=$(basename "$u")
  max=${EXPOSURE_MAX[$name]:-}
  [ -n "$max" ] || die "no exposure bound for $name"
  grep -q '^Documentation=man:' "$u" || die "$name: no Documentation=man:"
  out=$(systemd-analyze security --offline=true "$u" 2>&1 | tail -n 1) ||
    die "$name: systemd-analyze security: $out"
  log "$name: ${out#→ }"
  level=$(echo "$out" | grep -Eo '[0-9]+\.[0-9]' | head -n 1)
  [ "${level/./}" -le "$max" ] || die "$name: exposure $level is above ${max:0:-1}.${max: -1}"
done

# ---------------------------------------------------------------- man pages
pages=("$f"/usr/share/man/man*/*)
for p in rdmablk-target.8 rdmablk-target.toml.5 rdmablk.8 rdmablk-connect.8 rdmablk-bench.8; do
  ls "$f"/usr/share/man/man*/"$p.gz" >/dev/null 2>&1 || die "man page $p missing"
done
for p in "${pages[@]}"; do
  warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null) || die "man -l $p failed"
  [ -z "$warnings" ] || die "man -l $p warns: $warnings"
  text=$(MANWIDTH=80 man -l "$p" 2>/dev/null)
  echo "$text" | grep -q '^NAME' || die "man -l $p: no NAME section"
done
MANWIDTH=80 man -l "$f/usr/share/man/man5/rdmablk-target.toml.5.gz" | grep -q 'pending_connections' ||
  die "rdmablk-target.toml(5) lacks [limits] pending_connections"
log "${#pages[@]} man pages render without a warning"

# ---------------------------------------------------------------- completions
# What bash offers for the words of a command line (the last one being
# completed), through bash-completion's loader reading $f's completions.
complete_words() {
  BASH_COMPLETION_USER_DIR="$f/usr/share/bash-completion" bash --norc -c '
    source /usr/share/bash-completion/bash_completion
    words=("$@"); cmd=${words[0]}
    _completion_loader "$cmd"
    fn=$(complete -p "$cmd" | sed -n "s/.*-F \([^ ]*\) .*/\1/p")
    COMP_WORDS=("${words[@]}"); COMP_CWORD=$((${#words[@]} - 1))
    COMP_LINE="${words[*]}"; COMP_POINT=${#COMP_LINE}
    "$fn" "$cmd" "${words[-1]}" "${words[-2]}"
    printf "%s\n" "${COMPREPLY[@]}"' _ "$@"
}
expect_completion() {
  local want=$1; shift
  local got
  got=$(complete_words "$@")
  echo "$got" | grep -qx -- "$want" || die "bash completes '$*' to [$(echo $got)], not $want"
}
expect_completion --check rdmablk-target --ch
expect_completion reload rdmablk-target rel
expect_completion connect-all rdmablk conn
expect_completion --runtime rdmablk bench --run
expect_completion discover rdmablk di
[ -s "$f/usr/share/zsh/vendor-completions/_rdmablk" ] && [ -s "$f/usr/share/fish/vendor_completions.d/rdmablk-target.fish" ] ||
  die "zsh or fish completions missing"
log "bash completes subcommands and flags of both commands"

# ---------------------------------------------------------------- installed, under systemd
log "booting a container (systemd-nspawn, an overlay of /)"
mkdir -p "$work/ov"
mount -t tmpfs tmpfs "$work/ov"
mkdir -p "$work/ov/upper" "$work/ov/work" "$work/ov/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$work/ov/upper,workdir=$work/ov/work" "$work/ov/root"
root=$work/ov/root
# Nothing of this machine's own packages: the packages under test only.
for b in rdmablk-target rdmablk; do
  [ ! -e "$root/usr/bin/$b" ] || die "/usr/bin/$b exists already on this machine: not a clean start"
done
mkdir -p "$root/root/debs"
cp "${debs[@]}" "$root/root/debs/"
# The host's network (the target's listener is reached as on a storage
# node); CAP_IPC_LOCK, which nspawn drops by default, for the unit's
# bounding set to keep.
systemd-nspawn --quiet --register=no --keep-unit --capability=CAP_IPC_LOCK \
  --machine="rdmablk-pkg-$$" -D "$root" -b systemd.unit=basic.target \
  >"$work/console.log" 2>&1 &
nspawn=$!
for _ in $(seq 300); do
  leader=$(ps -o pid=,comm= --ppid "$nspawn" 2>/dev/null | awk '$2 == "systemd" {print $1; exit}' || true)
  [ -n "$leader" ] && break
  kill -0 "$nspawn" 2>/dev/null || { cat "$work/console.log" >&2; die "systemd-nspawn ended"; }
  sleep 0.1
done
[ -n "$leader" ] || die "the container's systemd did not start"
in_ct() { nsenter -t "$leader" -a -- "$@"; }
# Up to basic.target only: this machine's own services (multi-user.target)
# stay out. Until its bus is up, systemctl cannot ask.
state=""
for _ in $(seq 600); do
  state=$(nsenter -t "$leader" -a -- systemctl is-active basic.target 2>&1 || true)
  [ "$state" = active ] && break
  sleep 0.1
done
[ "$state" = active ] || { tail -n 40 "$work/console.log" >&2; die "the container did not boot: $state"; }
log "container up (basic.target)"

in_ct dpkg -i /root/debs/rdmablk-target_"${version}"_amd64.deb /root/debs/rdmablk_"${version}"_amd64.deb >"$work/dpkg.log" 2>&1 ||
  { cat "$work/dpkg.log" >&2; die "dpkg -i failed"; }
log "installed: $(in_ct dpkg-query -W -f='${Package} ${Version}  ' rdmablk-target rdmablk)"
enabled=$(in_ct systemctl is-enabled rdmablk-target 2>&1 || true)
[ "$enabled" = disabled ] ||
  die "the unit is $enabled after install (it should be disabled, waiting for the operator)"
in_ct rdmablk-target --check --config /etc/rdmablk/target.toml || die "--check of the installed default"
in_ct man -w rdmablk-target.toml >/dev/null || die "man rdmablk-target.toml is not found once installed"

in_ct systemctl start rdmablk-target || {
  in_ct systemctl status --no-pager -l rdmablk-target >&2 || true
  in_ct journalctl -u rdmablk-target --no-pager -n 40 >&2 || true
  die "systemctl start rdmablk-target"
}
in_ct systemctl is-active --quiet rdmablk-target || die "rdmablk-target is not active"
# The unit's hardening holds: its bounding set is CAP_DAC_OVERRIDE and
# CAP_IPC_LOCK (bits 1 and 14), and a seccomp filter is on (Seccomp: 2).
pid=$(in_ct systemctl show -P MainPID rdmablk-target)
status=$(in_ct cat "/proc/$pid/status")
echo "$status" | grep -q '^CapBnd:[[:space:]]*0000000000004002$' ||
  die "the daemon's capability bounding set is not the unit's: $(echo "$status" | grep CapBnd)"
echo "$status" | grep -q '^Seccomp:[[:space:]]*2$' || die "the daemon runs without the unit's seccomp filter"
bench=$(in_ct rdmablk bench -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-11.io.rdmablk:default \
  --rw randrw --bs 4k --qd 16 --runtime 3s --verify --json 2>"$work/bench.err") || {
  cat "$work/bench.err" >&2
  in_ct journalctl -u rdmablk-target --no-pager -n 40 >&2 || true
  die "rdmablk bench against the installed target"
}
summary=$(echo "$bench" | python3 -c '
import json, sys
j = json.load(sys.stdin)
ios = j["read"]["ios"] + j["write"]["ios"]
bad = j["read"]["errors"] + j["write"]["errors"] + j["verify_errors"]
iops = j["iops"]
print(f"{ios} I/Os verified, {iops:.0f} IOPS" if ios > 0 and bad == 0 else f"FAILED {j}")') ||
  die "rdmablk bench printed no JSON: $bench"
case "$summary" in FAILED*) die "rdmablk bench: $summary" ;; esac
log "the installed rdmablk bench against the unit's target: $summary"
in_ct systemctl reload rdmablk-target || die "systemctl reload rdmablk-target"
in_ct systemctl stop rdmablk-target
result=$(in_ct systemctl show -P Result rdmablk-target)
[ "$result" = success ] || { in_ct journalctl -u rdmablk-target --no-pager -n 40 >&2; die "the stop ended with $result"; }
in_ct journalctl -u rdmablk-target --no-pager -o cat | grep -q "listening on tcp://127.0.0.1:4420" ||
  die "the journal lacks the daemon's log"

in_ct dpkg -r rdmablk-target rdmablk >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; die "dpkg -r"; }
for gone in /usr/bin/rdmablk-target /usr/bin/rdmablk /lib/systemd/system/rdmablk-target.service \
  /usr/share/man/man8/rdmablk-target.8.gz /usr/share/bash-completion/completions/rdmablk; do
  ! in_ct test -e "$gone" || die "$gone is left after dpkg -r"
done
in_ct test -f /etc/rdmablk/target.toml || die "dpkg -r removed the configuration"
in_ct dpkg -P rdmablk-target >/dev/null 2>&1 || die "dpkg -P"
! in_ct test -e /etc/rdmablk/target.toml || die "dpkg -P left the configuration"
log "dpkg -r removed everything but /etc/rdmablk/target.toml; dpkg -P removed that too"
log "passed"
