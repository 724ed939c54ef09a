#!/usr/bin/env bash
# Installs what Beam's FlinkRunner needs, offline after the first run, into the
# engines cache (as scripts/install_prism.sh does for Prism), and prints the
# path asked for.
#
#   scripts/install_flink.sh              # the job-server jar (Maven, ~30 s once)
#   scripts/install_flink.sh cluster      # also a Flink distribution (PyPI,
#                                         # ~250 MB once) and the submission
#                                         # jar; prints its FLINK_HOME
#
# Versions: templates/flink/versions.env, which says why they are these. The job
# server is Beam's org.apache.beam.runners.flink.FlinkJobServerDriver from the
# non-shaded beam-runners-flink-1.19 and its dependencies; a thin jar whose
# manifest names that Main-Class and lists the jars on its Class-Path is what
# --flink_job_server_jar takes (Beam runs `java -jar` on it). The CLI finds
# it by itself for --runner FlinkRunner, so Beam never tries to download one.
# Its manifest also opens java.util and java.lang (Add-Opens, what `java -jar`
# reads): on Java 17 a checkpoint of a stable-input stage (a checkpointed
# streaming job's file sink) fails without them (Kryo writes a
# java.util.Arrays$ArrayList). The cluster's JVMs take Flink's own opens.
#
# The submission jar (cluster mode) is the base --flink_submit_uber_jar copies
# the pipeline into: its manifest starts FlinkPipelineRunner on the JobManager
# and lists the same jars by absolute file: URL, so a cluster whose JobManager
# and TaskManagers see this cache at the same path loads them from there and
# each job uploads only the pipeline (kilobytes) instead of the 152 MB of jars.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../templates/flink/versions.env
source "$ROOT/templates/flink/versions.env"
WHAT="${1:-job-server}"
case "$WHAT" in job-server|cluster) ;; *)
  echo "usage: $0 [job-server|cluster]" >&2; exit 2;; esac
CACHE="${NEARDUP_ENGINES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neardup-engines}"
FLINK_MINOR="${FLINK%.*}"
SERVER="$CACHE/flink/beam-$BEAM_FLINK_RUNNER-flink-$FLINK_MINOR"
JAR="$SERVER/beam-flink-job-server.jar"
SUBMIT_JAR="$SERVER/beam-flink-submit.jar"
HOME_DIR="$CACHE/flink/flink-$FLINK"
SERVER_OPENS="java.base/java.util java.base/java.lang"

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "install_flink: $1 is not installed ($2)" >&2; exit 1; }
}

install_job_server() {
  [[ -f "$JAR" ]] && return 0
  need java "Flink and its job server run on Java 11 or 17"
  need mvn "the runner and its dependencies come from Maven"
  need jar "the JDK's jar tool builds the thin jar"
  mkdir -p "$CACHE/flink"
  local tmp
  tmp="$(mktemp -d "$CACHE/flink/.server.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  # slf4j-simple: without a binding the job server logs nothing at all.
  cat > "$tmp/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>neardup</groupId><artifactId>flink-job-server</artifactId>
  <version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.beam</groupId>
      <artifactId>beam-runners-flink-$FLINK_MINOR</artifactId>
      <version>$BEAM_FLINK_RUNNER</version></dependency>
    <dependency><groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId><version>1.7.30</version></dependency>
  </dependencies>
</project>
POM
  mvn -q -B -f "$tmp/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$tmp/server/jars" >&2
  local entries=()
  for j in "$tmp"/server/jars/*.jar; do entries+=("jars/$(basename "$j")"); done
  ADD_OPENS="$SERVER_OPENS" manifest_jar "$tmp/server/beam-flink-job-server.jar" \
      org.apache.beam.runners.flink.FlinkJobServerDriver "${entries[@]}"
  # Moved into place last: an interrupted run never leaves a half install.
  rm -rf "$SERVER"
  mv "$tmp/server" "$SERVER"
}

# manifest_jar JAR MAIN_CLASS CLASS_PATH_ENTRY...: a jar holding only a
# manifest (with an Add-Opens line when ADD_OPENS is set), written beside JAR
# and moved over it (a JVM reading the old one keeps its copy).
manifest_jar() {
  local jar_path="$1" main="$2"
  shift 2
  local dir
  dir="$(mktemp -d "$(dirname "$jar_path")/.jar.XXXXXX")"
  {
    echo "Manifest-Version: 1.0"
    echo "Main-Class: $main"
    if [[ -n "${ADD_OPENS:-}" ]]; then echo "Add-Opens: $ADD_OPENS"; fi
    echo "Class-Path: $1"
    shift
    for entry in "$@"; do echo "  $entry"; done
  } > "$dir/MANIFEST.MF"
  mkdir "$dir/empty"
  jar cfm "$dir/out.jar" "$dir/MANIFEST.MF" -C "$dir/empty" .
  mv -f "$dir/out.jar" "$jar_path"
  rm -rf "$dir"
}

# Jars written before 2026-12-03 also listed "." (the jar's folder) on their
# Class-Path; Beam stages every Class-Path entry for a remote --flink_master
# and fails on that folder ("FileNotFoundException: ... (Is a directory)").
# Jars written before 2026-12-04 lack the Add-Opens line.
fix_job_server_manifest() {
  python3 - "$JAR" "$SERVER_OPENS" <<'PY' || return 0
import sys, zipfile
text = zipfile.ZipFile(sys.argv[1]).read("META-INF/MANIFEST.MF").decode()
text = text.replace("\r\n", "\n").replace("\n ", "")
fields = dict(l.split(": ", 1) for l in text.splitlines() if ": " in l)
stale = ("." in fields["Class-Path"].split()
         or fields.get("Add-Opens") != sys.argv[2])
sys.exit(0 if stale else 1)
PY
  need jar "the JDK's jar tool rewrites the job server's manifest"
  local entries=()
  for j in "$SERVER"/jars/*.jar; do entries+=("jars/$(basename "$j")"); done
  ADD_OPENS="$SERVER_OPENS" manifest_jar "$JAR" \
      org.apache.beam.runners.flink.FlinkJobServerDriver "${entries[@]}"
}

install_submit_jar() {
  [[ -f "$SUBMIT_JAR" ]] && return 0
  need jar "the JDK's jar tool builds the submission jar"
  need python3 "it writes the jars' file: URLs"
  local urls=()
  mapfile -t urls < <(python3 -c '
import pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.jar")): print(p.as_uri())
' "$SERVER/jars")
  manifest_jar "$SUBMIT_JAR" org.apache.beam.runners.flink.FlinkPipelineRunner \
      "${urls[@]}"
}

install_cluster() {
  [[ -x "$HOME_DIR/bin/jobmanager.sh" ]] && return 0
  need python3 "pip downloads the Flink distribution from PyPI"
  mkdir -p "$CACHE/flink"
  local tmp
  tmp="$(mktemp -d "$CACHE/flink/.dist.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download -q --no-deps --no-binary :all: \
      "apache-flink-libraries==$FLINK" -d "$tmp/dl" >&2
  python3 -m pip download -q --no-deps --only-binary :all: \
      --python-version 3.11 --platform manylinux1_x86_64 \
      "apache-flink==$FLINK" -d "$tmp/dl" >&2
  mkdir -p "$tmp/home" "$tmp/src" "$tmp/whl"
  tar xzf "$tmp/dl/apache-flink-libraries-$FLINK.tar.gz" -C "$tmp/src"
  local deps="$tmp/src/apache-flink-libraries-$FLINK/deps"
  mv "$deps/lib" "$deps/opt" "$deps/plugins" "$tmp/home/"
  python3 -m zipfile -e "$tmp"/dl/apache_flink-"$FLINK"-*.whl "$tmp/whl"
  mv "$tmp/whl/pyflink/bin" "$tmp/whl/pyflink/conf" "$tmp/home/"
  # bin/ relies on bash-java-utils.jar beside its scripts.
  cp "$deps/bin/bash-java-utils.jar" "$tmp/home/bin/"
  chmod +x "$tmp"/home/bin/*.sh "$tmp/home/bin/flink"
  mkdir -p "$tmp/home/log"
  rm -rf "$HOME_DIR"
  mv "$tmp/home" "$HOME_DIR"
}

install_job_server
fix_job_server_manifest
if [[ "$WHAT" == cluster ]]; then
  install_cluster
  install_submit_jar
  echo "$HOME_DIR"
else
  echo "$JAR"
fi
