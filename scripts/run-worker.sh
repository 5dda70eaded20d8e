#!/usr/bin/env bash
# Set up everything, then start a worker in ./worker (SQLite and local disk: nothing else to
# run) serving the example lambdas in examples/lambdas, on http://127.0.0.1:5000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
sprout=target/release/sprout
$sprout worker init worker
# The one service the example lambdas may reach on the network: the cache (for visits).
if ! grep -q '^\[\[network.allow\]\]' worker/config.toml; then
    cat >>worker/config.toml <<'ALLOW'

[[network.allow]]
name = "cache"
address = "127.0.0.1:11211"
ALLOW
fi
if $sprout worker status worker >/dev/null 2>&1; then
    echo "==> a worker is already running in ./worker"
else
    $sprout worker up worker --detach
fi
# The cache tier beside it (the visits example uses it): the memcached-compatible Sprout cache.
if ! (exec 3<>/dev/tcp/127.0.0.1/11211) 2>/dev/null; then
    nohup $sprout cache serve -p 11211 -m 64 -t 1 >worker/cache.log 2>&1 &
    echo $! >worker/cache.pid
    echo "==> cache on 127.0.0.1:11211 (pid $(cat worker/cache.pid); log worker/cache.log)"
fi
for lambda in examples/lambdas/*/; do
    $sprout deploy "$lambda" >/dev/null
    echo "deployed $(basename "$lambda")"
done
cat <<'USAGE'

The worker is serving on http://127.0.0.1:5000. Try:
  curl -X POST localhost:5000/run/echo -d '{"hello": "world"}'
  curl localhost:5000/run/hello/ada
  curl -X POST localhost:5000/run/fail -d 1          # 500, with the traceback
  curl -X POST localhost:5000/run/jinja -d '{"name": "ada"}'   # a lambda with a package
  curl -X POST localhost:5000/run/visits -d '{"page": "home"}' # counts in the cache tier
  target/release/sprout zygotes worker               # the import cache's Zygotes
  curl -H "Authorization: Bearer $(cat worker/api-token)" localhost:5000/stats   # the admin API needs the token
Its log is worker/worker.log; stop it with: target/release/sprout worker down worker
(and the cache with: kill $(cat worker/cache.pid))
USAGE
