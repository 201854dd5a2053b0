#!/usr/bin/env bash
# Build the Rust implementation of RocketMQ (crates.io rocketmq-namesrv and rocketmq-broker)
# into a cache folder outside the repository, for `jepsen run --system rocketmq-rust` and its
# test (tests/test_harness_rocketmq_rust.py). About 20-40 minutes on 2 cores and 1.3 GB of
# build files, deleted afterwards; run it once. It needs cargo with Rust >= 1.95 (the crates'
# rust-version); `nice -n 19 scripts/build-rocketmq-rust.sh` keeps a shared machine usable.
#
#   scripts/build-rocketmq-rust.sh [CACHE_DIR]
#
# CACHE_DIR defaults to $LEDGERMQ_ROCKETMQ_RUST_DIR, else ~/.cache/ledgermq/rocketmq-rust.
# The binaries land in CACHE_DIR/bin: rocketmq-namesrv-rust and rocketmq-broker-rust.
# Binaries already there are kept; FORCE=1 builds them again.
set -euo pipefail
VERSION=1.0.0
MIN_RUST=1.95
DIR="${1:-${LEDGERMQ_ROCKETMQ_RUST_DIR:-$HOME/.cache/ledgermq/rocketmq-rust}}"
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first" >&2; exit 2; }
have=$(rustc --version 2>/dev/null | awk '{print $2}')
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$MIN_RUST" "$have" | sort -V | head -n1)" != "$MIN_RUST" ]; then
  echo "rocketmq-*@$VERSION need Rust >= $MIN_RUST, found '${have:-none}': rustup update stable" >&2
  exit 2
fi
mkdir -p "$DIR"
export CARGO_TARGET_DIR="$DIR/target"
declare -A BIN=([rocketmq-namesrv]=rocketmq-namesrv-rust [rocketmq-broker]=rocketmq-broker-rust)
for crate in rocketmq-namesrv rocketmq-broker; do
  if [ -x "$DIR/bin/${BIN[$crate]}" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "$DIR/bin/${BIN[$crate]} is there already (FORCE=1 to build it again)"
    continue
  fi
  # --locked builds with the dependency versions the crate was published with; if those no
  # longer resolve (a yanked version), fall back to the newest compatible ones
  cargo install --locked --root "$DIR" "$crate@$VERSION" || cargo install --root "$DIR" "$crate@$VERSION"
done
for b in "${BIN[@]}"; do
  [ -x "$DIR/bin/$b" ] || { echo "build finished but $DIR/bin/$b is missing" >&2; exit 1; }
done
rm -rf "$CARGO_TARGET_DIR"  # the build files; the binaries stay in $DIR/bin
ls -l "$DIR/bin"
echo "built into $DIR/bin"
