#!/usr/bin/env bash
# Installs Beam's Prism runner (Go) at exactly the Beam version pinned in
# requirements.txt, into a cache folder, and prints the binary's path.
#
#   scripts/install_prism.sh            # build once (~1 min), then instant
#   NEARDUP_ENGINES_CACHE=/some/dir scripts/install_prism.sh
#
# Beam's Python SDK is then given --prism_location <path> (the CLI finds the
# cached binary by itself), so Beam never tries to download a release binary.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BEAM_VERSION="$(sed -n 's/^apache-beam==\([0-9.]*\).*/\1/p' "$ROOT/requirements.txt")"
if [[ -z "$BEAM_VERSION" ]]; then
  echo "install_prism: no apache-beam==X.Y.Z pin in requirements.txt" >&2
  exit 1
fi
CACHE="${NEARDUP_ENGINES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neardup-engines}"
DEST="$CACHE/prism/v$BEAM_VERSION"
BIN="$DEST/prism"
if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "install_prism: Go is not installed; Prism is built with 'go install'." >&2
  exit 1
fi
mkdir -p "$DEST"
TMP="$(mktemp -d "$DEST/.build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# GOFLAGS=-mod=mod: no go.mod around us may pin anything else.
GOBIN="$TMP" GOFLAGS=-mod=mod go install \
  "github.com/apache/beam/sdks/v2/go/cmd/prism@v$BEAM_VERSION" >&2
# Rename last, so a concurrent or interrupted run never leaves a half binary.
mv "$TMP/prism" "$BIN"
echo "$BIN"
