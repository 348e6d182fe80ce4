#!/usr/bin/env bash
# Builds the Debian packages rdmablk-target and rdmablk (and their -dbgsym
# debug symbols) into build/deb/, from this tree with the Rust toolchain on
# PATH: dpkg-buildpackage with debian/rules. The version is the crates'
# (debian/changelog must say the same: this script checks).
#
#   bash scripts/deb.sh        # then: dpkg -i build/deb/rdmablk-target_*.deb build/deb/rdmablk_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --package

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
changelog=$(dpkg-parsechangelog -S Version)
if [ "$version" != "$changelog" ]; then
  echo "deb: the crates are version $version but debian/changelog says $changelog;" \
    "add a changelog entry (dch -v $version)" >&2
  exit 1
fi
mkdir -p build/deb
rm -f build/deb/*.deb build/deb/*.ddeb
# -b: binary packages only; -nc: no `debian/rules clean` (it would not
# clean a cargo tree anyway); the .buildinfo and .changes go with the debs.
dpkg-buildpackage -b -nc --no-sign \
  --buildinfo-option=-ubuild/deb --buildinfo-file="build/deb/rdmablk_${version}_amd64.buildinfo" \
  --changes-option=-ubuild/deb --changes-file="build/deb/rdmablk_${version}_amd64.changes" \
  >build/deb/build.log 2>&1 || {
  tail -n 40 build/deb/build.log >&2
  echo "deb: dpkg-buildpackage failed (whole log: build/deb/build.log)" >&2
  exit 1
}
ls build/deb/*.deb
