#!/usr/bin/env bash
# Installs what Beam's FlinkRunner needs, offline after the first run, into the
# engines cache (as scripts/install_prism.sh does for Prism), and prints the
# path asked for.
#
#   scripts/install_flink.sh              # the job-server jar (Maven, ~30 s once)
#   scripts/install_flink.sh cluster      # also a Flink distribution (PyPI,
#                                         # ~250 MB once) and the submission
#                                         # jar; prints its FLINK_HOME
#   scripts/install_flink.sh kafka        # also Beam's KafkaIO: an expansion
#                                         # service, a job server and a
#                                         # submission jar that run KafkaIO,
#                                         # and a Kafka broker's jars (Maven,
#                                         # ~200 MB once); prints the
#                                         # expansion service's jar
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
case "$WHAT" in job-server|cluster|kafka) ;; *)
  echo "usage: $0 [job-server|cluster|kafka]" >&2; exit 2;; esac
CACHE="${NEARDUP_ENGINES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neardup-engines}"
FLINK_MINOR="${FLINK%.*}"
SERVER="$CACHE/flink/beam-$BEAM_FLINK_RUNNER-flink-$FLINK_MINOR"
JAR="$SERVER/beam-flink-job-server.jar"
SUBMIT_JAR="$SERVER/beam-flink-submit.jar"
HOME_DIR="$CACHE/flink/flink-$FLINK"
SERVER_OPENS="java.base/java.util java.base/java.lang"
KAFKA_IO="$CACHE/flink/beam-$BEAM_FLINK_RUNNER-kafka-io"
EXPANSION_JAR="$KAFKA_IO/beam-kafka-expansion-service.jar"
KAFKA_SERVER_JAR="$KAFKA_IO/beam-flink-job-server-kafka.jar"
KAFKA_SUBMIT_JAR="$KAFKA_IO/beam-flink-submit-kafka.jar"
BROKER="$CACHE/kafka/kafka-$KAFKA_BROKER"

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "install_flink: $1 is not installed ($2)" >&2; exit 1; }
}

# resolve DIR DEPENDENCY_XML...: copies the dependencies (and theirs) into
# DIR/jars, with slf4j-simple (without a binding Beam's Java services log
# nothing at all).
resolve() {
  local dir="$1"
  shift
  need mvn "Beam's Java artifacts come from Maven"
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0">'
    echo '<modelVersion>4.0.0</modelVersion><groupId>neardup</groupId>'
    echo '<artifactId>engine</artifactId><version>1</version><dependencies>'
    printf '%s\n' "$@"
    echo '<dependency><groupId>org.slf4j</groupId>'
    echo '<artifactId>slf4j-simple</artifactId><version>1.7.30</version>'
    echo '</dependency></dependencies></project>'
  } > "$dir/pom.xml"
  mvn -q -B -f "$dir/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$dir/jars" >&2
}

dependency() {  # GROUP ARTIFACT VERSION [EXCLUDED_GROUP]
  echo "<dependency><groupId>$1</groupId><artifactId>$2</artifactId>"
  echo "<version>$3</version>"
  if [[ -n "${4:-}" ]]; then
    echo "<exclusions><exclusion><groupId>$4</groupId>"
    echo "<artifactId>*</artifactId></exclusion></exclusions>"
  fi
  echo "</dependency>"
}

install_job_server() {
  [[ -f "$JAR" ]] && return 0
  need java "Flink and its job server run on Java 11 or 17"
  need jar "the JDK's jar tool builds the thin jar"
  mkdir -p "$CACHE/flink"
  local tmp
  tmp="$(mktemp -d "$CACHE/flink/.server.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  mkdir "$tmp/server"
  resolve "$tmp/server" "$(dependency org.apache.beam \
      "beam-runners-flink-$FLINK_MINOR" "$BEAM_FLINK_RUNNER")"
  rm "$tmp/server/pom.xml"
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

# Beam's KafkaIO and expansion service at the runner's version, resolved on
# their own (io.confluent's repository is not reachable; its schema-registry
# serializers are not used here). The expansion service's jar lists them
# all; the Kafka job server's lists the job server's jars and then those of
# these that the job server lacks (by artifact, so that Maven's choice of
# versions for the runner stays as it is).
install_kafka_io() {
  [[ -f "$KAFKA_SERVER_JAR" ]] && return 0
  need jar "the JDK's jar tool builds the thin jars"
  need python3 "it compares the two sets of jars"
  mkdir -p "$CACHE/flink"
  local tmp
  tmp="$(mktemp -d "$CACHE/flink/.kafka-io.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  mkdir "$tmp/io"
  resolve "$tmp/io" \
      "$(dependency org.apache.beam beam-sdks-java-io-kafka \
          "$BEAM_FLINK_RUNNER" io.confluent)" \
      "$(dependency org.apache.beam beam-sdks-java-expansion-service \
          "$BEAM_FLINK_RUNNER")" \
      "$(dependency org.apache.kafka kafka-clients "$KAFKA_CLIENTS")" \
      "$(dependency com.github.jbellis jamm "$JAMM")"
  rm "$tmp/io/pom.xml"
  local entries=() extra=()
  for j in "$tmp"/io/jars/*.jar; do entries+=("jars/$(basename "$j")"); done
  manifest_jar "$tmp/io/$(basename "$EXPANSION_JAR")" \
      org.apache.beam.sdk.expansion.service.ExpansionService "${entries[@]}"
  mapfile -t extra < <(python3 - "$SERVER/jars" "$tmp/io/jars" <<'PY'
import pathlib, re, sys
def artifact(p):
    return re.sub(r"-\d[^-]*(-[A-Za-z][^-]*)?\.jar$", "", p.name)
have = {artifact(p) for p in pathlib.Path(sys.argv[1]).glob("*.jar")}
for p in sorted(pathlib.Path(sys.argv[2]).glob("*.jar")):
    if artifact(p) not in have:
        print("jars/" + p.name)
PY
)
  entries=()
  for j in "$SERVER"/jars/*.jar; do
    entries+=("../$(basename "$SERVER")/jars/$(basename "$j")")
  done
  ADD_OPENS="$SERVER_OPENS" manifest_jar \
      "$tmp/io/$(basename "$KAFKA_SERVER_JAR")" \
      org.apache.beam.runners.flink.FlinkJobServerDriver \
      "${entries[@]}" "${extra[@]}"
  rm -rf "$KAFKA_IO"
  mv "$tmp/io" "$KAFKA_IO"
}

# The submission jar of Kafka jobs (--flink_submit_uber_jar on a session
# cluster): the Kafka job server's Class-Path as absolute file: URLs, like
# beam-flink-submit.jar's (the TaskManagers' lib/ then needs KafkaIO's extra
# jars too: pipeline.engines.kafka_taskmanager_jars()).
install_kafka_submit_jar() {
  [[ -f "$KAFKA_SUBMIT_JAR" ]] && return 0
  need jar "the JDK's jar tool builds the submission jar"
  need python3 "it writes the jars' file: URLs"
  local urls=()
  mapfile -t urls < <(python3 - "$KAFKA_SERVER_JAR" <<'PY'
import pathlib, sys, zipfile
jar = pathlib.Path(sys.argv[1])
text = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF").decode()
text = text.replace("\r\n", "\n").replace("\n ", "")
fields = dict(l.split(": ", 1) for l in text.splitlines() if ": " in l)
for entry in fields["Class-Path"].split():
    print((jar.parent / entry).resolve().as_uri())
PY
)
  manifest_jar "$KAFKA_SUBMIT_JAR" \
      org.apache.beam.runners.flink.FlinkPipelineRunner "${urls[@]}"
}

# The broker's jars (kafka.Kafka, KRaft mode; scripts/kafka.sh starts it).
install_broker() {
  [[ -d "$BROKER/jars" ]] && return 0
  mkdir -p "$CACHE/kafka"
  local tmp
  tmp="$(mktemp -d "$CACHE/kafka/.broker.XXXXXX")"
  trap 'rm -rf "$tmp"' RETURN
  resolve "$tmp" "$(dependency org.apache.kafka kafka_2.13 "$KAFKA_BROKER")"
  rm -rf "$BROKER"
  mkdir -p "$BROKER"
  mv "$tmp/jars" "$BROKER/jars"
}

install_job_server
fix_job_server_manifest
case "$WHAT" in
  cluster)
    install_cluster
    install_submit_jar
    echo "$HOME_DIR";;
  kafka)
    install_kafka_io
    install_kafka_submit_jar
    install_broker
    echo "$EXPANSION_JAR";;
  *)
    echo "$JAR";;
esac
