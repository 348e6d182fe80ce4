#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests and end-to-end tests
# with real processes. `--quick` skips formatting and lints.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

bash scripts/setup.sh --test
if [ $quick -eq 0 ]; then
  cargo fmt --all -- --check
  cargo clippy --release --all-targets -- -D warnings
fi
cargo build --release
cargo test --release --workspace
