#!/usr/bin/env bash
# Builds rdmablk and runs the target on its embedded default: a 1 GiB memory
# namespace, nqn.2026-11.io.rdmablk:default, on tcp://127.0.0.1:4420.
# Extra arguments go to rdmablk-target (see: rdmablk-target --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --quiet
exec build/release/rdmablk-target "$@"
