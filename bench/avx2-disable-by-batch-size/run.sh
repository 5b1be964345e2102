#!/bin/bash
cd /work/main
S=.venv/bin/specsure
$S serve --no-enable-prefix-caching --port 8201 > /tmp/dbs/plain.log 2>&1 &
$S serve --no-enable-prefix-caching --port 8202 --speculative-config '{"method": "ngram"}' > /tmp/dbs/ngram.log 2>&1 &
$S serve --no-enable-prefix-caching --port 8203 --speculative-config '{"method": "ngram", "disable_by_batch_size": 4}' > /tmp/dbs/ngram4.log 2>&1 &
$S serve --no-enable-prefix-caching --port 8204 --speculative-config '{"method": "ngram", "disable_by_batch_size": 8}' > /tmp/dbs/ngram8.log 2>&1 &
for p in 8201 8202 8203 8204; do for i in $(seq 1 120); do curl -s localhost:$p/health >/dev/null && break; sleep 1; done; done
date
$S bench serve --url plain=http://127.0.0.1:8201 --url ngram=http://127.0.0.1:8202 --url ngram-dbs4=http://127.0.0.1:8203 --url ngram-dbs8=http://127.0.0.1:8204 --concurrency 1,2,4,8 --out /tmp/dbs/serve > /tmp/dbs/bench.log 2>&1
echo rc=$?
date
pkill -f 'specsure serve --port 82'
