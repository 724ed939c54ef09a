#!/usr/bin/env bash
# A local Kafka for the streaming job: a single-node KRaft broker and Beam's
# KafkaIO expansion service, from the jars that scripts/install_flink.sh kafka
# caches (fetched on first use), each started in its own process group and
# stopped by the pid it wrote.
#
#   scripts/kafka.sh start     # prints the two addresses once both listen
#   scripts/kafka.sh stop      # stops both (by pid), keeps the broker's data
#   scripts/kafka.sh status
#
# Settings (environment): KAFKA_STATE (default <engines cache>/kafka/run: the
# broker's data, logs and pid files), KAFKA_PORT (9092), KAFKA_CONTROLLER_PORT
# (9093), EXPANSION_PORT (8097). The job then takes
#   --bootstrap_servers 127.0.0.1:$KAFKA_PORT --expansion_service localhost:$EXPANSION_PORT
# (without --expansion_service it starts its own from the same jar).
# Starting is idempotent: a process whose pid file names a live process is
# left as it is.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${NEARDUP_ENGINES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neardup-engines}"
STATE="${KAFKA_STATE:-$CACHE/kafka/run}"
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
EXPANSION_PORT="${EXPANSION_PORT:-8097}"
START_TIMEOUT_S=60

# shellcheck source=../templates/flink/versions.env
source "$ROOT/templates/flink/versions.env"
BROKER_JARS="$CACHE/kafka/kafka-$KAFKA_BROKER/jars"
EXPANSION_JAR="$CACHE/flink/beam-$BEAM_FLINK_RUNNER-kafka-io/beam-kafka-expansion-service.jar"

alive() {  # NAME: whether NAME's pid file names a live process
  [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null
}

wait_port() {  # NAME PORT
  local waited=0
  until (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; do
    if ! alive "$1"; then
      echo "kafka.sh: $1 exited; its log:" >&2
      tail -n 30 "$STATE/$1.log" >&2
      exit 1
    fi
    if (( waited >= START_TIMEOUT_S * 5 )); then
      echo "kafka.sh: $1 not listening on $2 after ${START_TIMEOUT_S}s" >&2
      stop_one "$1"
      exit 1
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
}

launch() {  # NAME COMMAND...: in a new session, its pid in NAME.pid
  local name="$1"
  shift
  setsid "$@" > "$STATE/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/$name.pid"
}

start_broker() {
  alive broker && return 0
  cat > "$STATE/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$STATE/data
num.partitions=2
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
group.initial.rebalance.delay.ms=0
PROPS
  if [[ ! -f "$STATE/data/meta.properties" ]]; then
    local cluster_id
    cluster_id="$(java -cp "$BROKER_JARS/*" kafka.tools.StorageTool \
        random-uuid 2>/dev/null)"
    java -cp "$BROKER_JARS/*" kafka.tools.StorageTool format \
        -t "$cluster_id" -c "$STATE/server.properties" \
        > "$STATE/format.log" 2>&1
  fi
  launch broker java -Xmx512m -cp "$BROKER_JARS/*" kafka.Kafka \
      "$STATE/server.properties"
  wait_port broker "$PORT"
}

start_expansion() {
  alive expansion && return 0
  launch expansion java -jar "$EXPANSION_JAR" "$EXPANSION_PORT" \
      --javaClassLookupAllowlistFile='*' --defaultEnvironmentType=EMBEDDED \
      --experiments=use_deprecated_read
  wait_port expansion "$EXPANSION_PORT"
}

stop_one() {  # NAME: TERM to its group, KILL after 10 s
  alive "$1" || { rm -f "$STATE/$1.pid"; return 0; }
  local pid
  pid="$(cat "$STATE/$1.pid")"
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$STATE/$1.pid"
}

case "${1:-}" in
  start)
    command -v java >/dev/null || {
      echo "kafka.sh: java is not installed (Java 17)" >&2; exit 1; }
    bash "$ROOT/scripts/install_flink.sh" kafka > /dev/null
    mkdir -p "$STATE"
    start_broker
    start_expansion
    echo "bootstrap_servers=127.0.0.1:$PORT"
    echo "expansion_service=localhost:$EXPANSION_PORT";;
  stop)
    stop_one expansion
    stop_one broker;;
  status)
    for name in broker expansion; do
      if alive "$name"; then echo "$name: running, pid $(cat "$STATE/$name.pid")"
      else echo "$name: stopped"; fi
    done;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2;;
esac
