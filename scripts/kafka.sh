#!/usr/bin/env bash
# An Apache Kafka broker for Kafka triggers, from Maven Central (no ZooKeeper: KRaft, one node
# that is both broker and controller).
#
#   scripts/kafka.sh fetch            copy the broker's jars into $KAFKA_LIBS (once per machine)
#   scripts/kafka.sh up DIR [PORT]    format DIR and start a broker on 127.0.0.1:PORT (9092)
#   scripts/kafka.sh down DIR         stop it
#
# The broker's log is DIR/broker.log; its pid DIR/broker.pid.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/kafka/pom.xml")"
KAFKA_LIBS="${KAFKA_LIBS:-/var/lib/sprout/kafka-$KAFKA_VERSION/libs}"
HEAP="${KAFKA_HEAP:-512m}"

fetch() {
    if [ -f "$KAFKA_LIBS/.complete" ]; then
        return
    fi
    command -v mvn >/dev/null || { echo "kafka.sh: mvn is missing (apt-get install maven)" >&2; exit 1; }
    echo "kafka.sh: fetching Apache Kafka $KAFKA_VERSION and its dependencies into $KAFKA_LIBS" >&2
    rm -rf "$KAFKA_LIBS"
    mkdir -p "$KAFKA_LIBS"
    mvn -q -B -f "$HERE/kafka/pom.xml" \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$KAFKA_LIBS"
    touch "$KAFKA_LIBS/.complete"
}

java_cp() {
    java -Xms128m -Xmx"$HEAP" -Djava.awt.headless=true -cp "$KAFKA_LIBS/*" "$@"
}

up() {
    local dir="$1" port="${2:-9092}"
    local controller=$((port + 1))
    fetch
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/broker.pid" ] && kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null; then
        echo "kafka.sh: a broker already runs for $dir (pid $(cat "$dir/broker.pid"))" >&2
        exit 1
    fi
    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    if [ ! -f "$dir/data/meta.properties" ]; then
        local cluster
        cluster="$(java_cp kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)"
        java_cp kafka.tools.StorageTool format --cluster-id "$cluster" --config "$dir/server.properties" >"$dir/format.log" 2>&1 \
            || { cat "$dir/format.log" >&2; exit 1; }
    fi
    setsid java -Xms128m -Xmx"$HEAP" -Djava.awt.headless=true -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties" \
        >"$dir/broker.log" 2>&1 </dev/null &
    echo $! > "$dir/broker.pid"
    for _ in $(seq 1 600); do
        if ! kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null; then
            echo "kafka.sh: the broker exited; the end of $dir/broker.log:" >&2
            tail -20 "$dir/broker.log" >&2
            exit 1
        fi
        if grep -q "Kafka Server started" "$dir/broker.log" && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "kafka.sh: broker ready on 127.0.0.1:$port (pid $(cat "$dir/broker.pid"))" >&2
            return
        fi
        sleep 0.2
    done
    echo "kafka.sh: the broker did not start within 120 s (see $dir/broker.log)" >&2
    down "$dir"
    exit 1
}

down() {
    local dir="$1"
    [ -f "$dir/broker.pid" ] || return 0
    local pid
    pid="$(cat "$dir/broker.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 150); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/broker.pid"
}

case "${1:-}" in
    fetch) fetch ;;
    up) up "${2:?usage: kafka.sh up DIR [PORT]}" "${3:-9092}" ;;
    down) down "${2:?usage: kafka.sh down DIR}" ;;
    *) echo "usage: scripts/kafka.sh fetch | up DIR [PORT] | down DIR" >&2; exit 2 ;;
esac
