#!/usr/bin/env bash
# Everything Sprout needs on a fresh Debian 12 machine, as root: Debian packages, Python
# packages, the release build, the machine-wide sandbox base image, gVisor's runsc and Kafka's
# broker. Safe to run again. What does not wait on another step runs beside it: the release
# build (the critical path) starts as soon as its own Debian packages are in, and the base
# image's debootstrap as soon as the build has linked the small binary that makes it, while
# the rest of the packages install and the rest of the workspace compiles; runsc (the Go
# module proxy, at a lower priority than the build) and Kafka (Maven Central) come meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/sprout-setup
background=()
in_background() {
    local name=$1
    shift
    "$@" >"/tmp/sprout-setup/$name.log" 2>&1 &
    background+=("$name:$!")
}
wait_for_background() {
    for job in "${background[@]}"; do
        name=${job%%:*}
        if ! wait "${job##*:}"; then
            echo "setup: $name failed; the end of /tmp/sprout-setup/$name.log:" >&2
            tail -n 40 "/tmp/sprout-setup/$name.log" >&2
            exit 1
        fi
    done
    background=()
}
export DEBIAN_FRONTEND=noninteractive
apt_updated=
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "==> apt-get install ${missing[*]}"
    [ -n "$apt_updated" ] || { apt-get update -q; apt_updated=1; }
    apt-get install -y -q --no-install-recommends "${missing[@]}"
    installed+=("${missing[@]}")
}
installed=()

# What the build links against (rdkafka-sys finds librdkafka with pkg-config), and debootstrap
# for the base image; then the build and the base image go on in the background.
apt_install pkg-config librdkafka-dev binutils debootstrap
build_and_base_image() {
    # cargo's JSON messages say when sprout-base-image is linked: debootstrap starts then.
    local base='' status=/tmp/sprout-setup/cargo.status
    rm -f "$status"
    while IFS= read -r line; do
        if [ -z "$base" ] && [[ $line == *'"reason":"compiler-artifact"'* && $line == *'/sprout-base-image"'* ]]; then
            echo "sprout-base-image linked ${SECONDS} s into set-up: the base image builds beside the rest of the workspace"
            target/release/sprout-base-image >/tmp/sprout-setup/base-image.log 2>&1 &
            base=$!
        fi
    done < <(cargo build --release --quiet --message-format=json-render-diagnostics; echo $? >"$status")
    [ "$(cat "$status" 2>/dev/null)" = 0 ] || { echo "cargo build --release failed"; return 1; }
    echo "cargo build --release done ${SECONDS} s into set-up"
    if [ -z "$base" ]; then  # cargo names fresh artifacts too: only if its message format changed
        target/release/sprout-base-image >/tmp/sprout-setup/base-image.log 2>&1 &
        base=$!
    fi
    wait "$base" || { echo "the base image failed:"; cat /tmp/sprout-setup/base-image.log; return 1; }
    cat /tmp/sprout-setup/base-image.log
    echo "base image done ${SECONDS} s into set-up"
}
echo "==> cargo build --release and the sandbox base image (debootstrap once per machine), in the background"
in_background build build_and_base_image
echo "==> gVisor's runsc (once per machine), in the background at a lower priority"
in_background runsc nice -n 10 bash scripts/gvisor.sh

apt_install runc docker.io postgresql memcached libmemcached-tools nginx acl chromium chromium-driver nftables iproute2 python3-venv maven e2fsprogs haproxy prometheus uwsgi uwsgi-plugin-python3
# Services some of these packages start on their default ports: the tests and benchmarks start
# their own, on their own ports and cores (memcached 11211; HAProxy, which `sprout fleet up`
# starts in front of each fleet; nginx on port 80, which `sprout olio up` starts per
# deployment; uWSGI, whose Emperor `sprout olio fleet-up` starts; Prometheus on 9090, which
# tests/worker/test_prometheus.py starts scraping a worker, and a node exporter in case one
# came).
for service in memcached haproxy nginx uwsgi prometheus prometheus-node-exporter; do
    if [[ " ${installed[*]} " == *" ${service%-node-exporter} "* ]]; then
        service "$service" stop >/dev/null 2>&1 || true
    fi
done
echo "==> Kafka's broker (Maven Central, once per machine), in the background"
in_background kafka bash scripts/kafka.sh fetch

echo "==> python packages (pytest, matplotlib; psycopg for sprout.store on PostgreSQL; the store benchmark's peers; memcached clients for sprout.cache and its tests; a Kafka producer for the trigger tests; Olio's pinned requirements, gunicorn and the test clients; ruff, pinned, for the lint)"
python3 -m pip install -q --disable-pip-version-check "pytest>=7" "pytest-xdist>=3.5" "matplotlib>=3.6" "psycopg[binary]>=3.1" "sqlalchemy>=2,<3" "peewee>=3.17" "pymemcache>=4" "python-binary-memcached>=0.31" "flask>=3.1" "pillow>=10.1" "gunicorn>=25.1" "requests>=2.31" "pypdf>=4" "selenium>=4.15" "confluent-kafka>=2.3" "ruff==0.17.6"
# The tests import Olio in this interpreter (the conventional deployment makes its own virtual
# environment on Debian's python3, olio_deploy/conventional.py): the same pins as its lambda.
python3 -m pip install -q --disable-pip-version-check -r apps/olio/requirements.txt

echo "==> waiting for the build, the base image, runsc and Kafka"
wait_for_background
cat /tmp/sprout-setup/build.log
target/release/sprout worker init /tmp/sprout-setup >/dev/null
# Debian's python3 here at the base's version: both Cloudstone stacks then run one CPython build.
bash scripts/align-python.sh
echo "==> ready: target/release/sprout"
