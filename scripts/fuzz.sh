#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) under libFuzzer for SECONDS
# each (default 30): the decoders the network feeds, with the checks of
# rdmablk_common::fuzzing and rdmablk::fuzzing. Needs a nightly toolchain;
# installs cargo-fuzz when it is missing. Without nightly it says so and
# does nothing.
#
# Not part of .ci/run nor scripts/test.sh: `cargo test` replays the committed
# corpus (fuzz/corpus/<target>/) on stable instead.
#
# libFuzzer starts from the committed corpus and keeps what it finds in
# fuzz/work/<target>/ (not committed; to grow the committed corpus, merge
# with `cargo +nightly fuzz cmin` and keep it to tens of small files). When a
# target crashes, its reproducer is copied to fuzz/corpus/<target>/ and the
# script exits non-zero: fix the decoder, and commit the reproducer with the
# fix (`cargo +nightly fuzz tmin <target> <file>` shrinks it first).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-30}
if [ $# -gt 0 ]; then shift; fi
case $secs in
  '' | *[!0-9]*)
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
    exit 2
    ;;
esac

# (grep reads all of it: with pipefail, an early exit could fail rustup.)
if ! rustup toolchain list 2>/dev/null | grep '^nightly' >/dev/null; then
  echo "fuzz.sh: no nightly toolchain (rustup toolchain install nightly): not fuzzing" >&2
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  cargo install --locked cargo-fuzz
fi

cd fuzz
# Debug assertions on: arithmetic overflow is a crash too.
if [ $# -gt 0 ]; then
  targets=("$@")
  for t in "${targets[@]}"; do
    cargo +nightly fuzz build --debug-assertions "$t"
  done
else
  mapfile -t targets < <(cargo +nightly fuzz list)
  cargo +nightly fuzz build --debug-assertions
fi

failed=()
for t in "${targets[@]}"; do
  mkdir -p "work/$t" "corpus/$t"
  rm -rf "artifacts/$t"
  mkdir -p "artifacts/$t"
  echo "== $t: ${secs}s" >&2
  # The first corpus directory receives new inputs: the scratch one.
  if cargo +nightly fuzz run --debug-assertions "$t" "$root/fuzz/work/$t" "$root/fuzz/corpus/$t" -- \
    -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
    continue
  fi
  failed+=("$t")
  found=0
  for f in "artifacts/$t"/*; do
    [ -f "$f" ] || continue
    cp "$f" "corpus/$t/"
    echo "fuzz.sh: $t: reproducer fuzz/corpus/$t/$(basename "$f")" >&2
    found=1
  done
  [ $found -eq 1 ] || echo "fuzz.sh: $t failed without a reproducer (build or libFuzzer error)" >&2
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: failing targets: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${secs}s each without a crash" >&2
