#!/usr/bin/env bash
# Builds google-research/deduplicate-text-datasets (the Rust suffix-array
# tool, bench/substrings.py's peer) into ~/.cache/neardup-bench/, outside the
# repository. Usage: scripts/install_suffix_array.sh [source checkout or git dir]
# Without an argument it clones the repository at the pinned commit.
set -euo pipefail
COMMIT=4e9888ac3f95dc4f6169867a04c4c19df02dafe3
CACHE="${NEARDUP_BENCH_CACHE:-$HOME/.cache/neardup-bench}"
DEST="$CACHE/deduplicate-text-datasets"
SRC="${1:-}"
mkdir -p "$CACHE"
if [ ! -d "$DEST/src" ]; then
  if [ -n "$SRC" ] && [ -d "$SRC" ]; then
    git clone -q "$SRC" "$DEST"
  else
    git clone -q https://github.com/google-research/deduplicate-text-datasets "$DEST"
  fi
fi
git -C "$DEST" checkout -q "$COMMIT"
cd "$DEST"
cargo build --release -q
echo "$DEST/target/release/dedup_dataset"
