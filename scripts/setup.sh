#!/usr/bin/env bash
# Everything Sprout needs on a fresh Debian 12 machine, as root: Debian packages, Python
# packages, the release build, the machine-wide sandbox base image, gVisor's runsc and Kafka's
# broker (those two built and fetched in the background meanwhile). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in debootstrap runc docker.io postgresql memcached libmemcached-tools nginx acl chromium chromium-driver nftables iproute2 python3-venv binutils librdkafka-dev pkg-config maven e2fsprogs haproxy prometheus uwsgi uwsgi-plugin-python3; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "==> apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need_apt[@]}"
    if [[ " ${need_apt[*]} " == *" memcached "* ]]; then
        # Debian's package starts a memcached service on port 11211; the tests and the cache
        # benchmark start their own, on their own ports and cores.
        service memcached stop >/dev/null 2>&1 || true
    fi
    if [[ " ${need_apt[*]} " == *" haproxy "* ]]; then
        # And HAProxy's: `sprout fleet up` starts its own in front of each fleet.
        service haproxy stop >/dev/null 2>&1 || true
    fi
    if [[ " ${need_apt[*]} " == *" nginx "* ]]; then
        # Likewise nginx on port 80: the Olio deployments start their own (sprout olio up).
        service nginx stop >/dev/null 2>&1 || true
    fi
    if [[ " ${need_apt[*]} " == *" uwsgi "* ]]; then
        # Debian's uWSGI service runs the apps in /etc/uwsgi/apps-enabled (none); the
        # conventional-ondemand Olio fleet starts its own Emperor (sprout olio fleet-up).
        service uwsgi stop >/dev/null 2>&1 || true
    fi
    if [[ " ${need_apt[*]} " == *" prometheus "* ]]; then
        # And Prometheus on port 9090 (without recommends it pulls in no node exporter; stopped
        # all the same in case one was there): tests/worker/test_prometheus.py starts its own
        # server, scraping a worker, on a free port.
        service prometheus stop >/dev/null 2>&1 || true
        service prometheus-node-exporter stop >/dev/null 2>&1 || true
    fi
fi

# What is only downloaded and built once per machine goes on in the background meanwhile:
# gVisor's runsc (the Go module proxy) and Apache Kafka's broker (Maven Central).
mkdir -p /tmp/sprout-setup
background=()
in_background() {
    local name=$1
    shift
    "$@" >"/tmp/sprout-setup/$name.log" 2>&1 &
    background+=("$name:$!")
}
in_background runsc bash scripts/gvisor.sh
in_background kafka bash scripts/kafka.sh fetch

echo "==> python packages (pytest, matplotlib; psycopg for sprout.store on PostgreSQL; the store benchmark's peers; memcached clients for sprout.cache and its tests; a Kafka producer for the trigger tests; Olio's pinned requirements, gunicorn and the test clients; ruff, pinned, for the lint)"
python3 -m pip install -q --disable-pip-version-check "pytest>=7" "pytest-xdist>=3.5" "matplotlib>=3.6" "psycopg[binary]>=3.1" "sqlalchemy>=2,<3" "peewee>=3.17" "pymemcache>=4" "python-binary-memcached>=0.31" "flask>=3.1" "pillow>=10.1" "gunicorn>=25.1" "requests>=2.31" "pypdf>=4" "selenium>=4.15" "confluent-kafka>=2.3" "ruff==0.17.6"
# The tests import Olio in this interpreter (the conventional deployment makes its own virtual
# environment on Debian's python3, olio_deploy/conventional.py): the same pins as its lambda.
python3 -m pip install -q --disable-pip-version-check -r apps/olio/requirements.txt

echo "==> cargo build --release"
cargo build --release --quiet

echo "==> sandbox base image (debootstrap once per machine, reused after)"
target/release/sprout worker init /tmp/sprout-setup >/dev/null
# Debian's python3 here at the base's version: both Cloudstone stacks then run one CPython build.
bash scripts/align-python.sh
echo "==> gVisor's runsc (for the gvisor back-end) and Kafka's broker (for Kafka triggers): waiting for the background"
for job in "${background[@]}"; do
    name=${job%%:*}
    if ! wait "${job##*:}"; then
        echo "setup: $name failed; the end of /tmp/sprout-setup/$name.log:" >&2
        tail -n 40 "/tmp/sprout-setup/$name.log" >&2
        exit 1
    fi
done
echo "==> ready: target/release/sprout"
