#!/usr/bin/env bash
# Fetches Beam's Flink job-server jar for the Beam version pinned in
# requirements.txt with Maven, into a cache folder, and prints its path:
# the newest Flink version that Beam release supports and that runs on
# Java 17 is tried first. Pass the path to the job with
#   --runner FlinkRunner --flink_version X.Y --flink_job_server_jar <path>
# so that Beam never tries to download anything itself.
#
# On the machines this project is developed on, Maven Central's mirror
# serves no beam-runners-flink-*-job-server artifact at any Beam version
# (checked 2026-12-01), so this script exits 1 there, naming what it tried.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BEAM_VERSION="$(sed -n 's/^apache-beam==\([0-9.]*\).*/\1/p' "$ROOT/requirements.txt")"
CACHE="${NEARDUP_ENGINES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neardup-engines}"
# Beam 2.77's --flink_version choices, newest first; all run on Java 17.
FLINK_VERSIONS="${FLINK_VERSIONS:-2.2 2.1 2.0 1.20 1.19}"
for flink in $FLINK_VERSIONS; do
  jar="$CACHE/flink/beam-runners-flink-$flink-job-server-$BEAM_VERSION.jar"
  if [[ -f "$jar" ]]; then
    echo "$jar"
    exit 0
  fi
done
command -v mvn >/dev/null 2>&1 || { echo "install_flink_job_server: Maven (mvn) is not installed" >&2; exit 1; }
tried=()
for flink in $FLINK_VERSIONS; do
  artifact="org.apache.beam:beam-runners-flink-$flink-job-server:$BEAM_VERSION"
  jar="$CACHE/flink/beam-runners-flink-$flink-job-server-$BEAM_VERSION.jar"
  mkdir -p "$CACHE/flink"
  if mvn -q dependency:copy -Dartifact="$artifact" -Dtransitive=false \
       -DoutputDirectory="$CACHE/flink/.tmp" >&2; then
    mv "$CACHE/flink/.tmp/$(basename "$jar")" "$jar"
    echo "$jar"
    exit 0
  fi
  tried+=("$artifact")
done
echo "install_flink_job_server: Maven served none of: ${tried[*]}" >&2
exit 1
