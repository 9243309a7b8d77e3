#!/usr/bin/env bash
# A far PostgreSQL: a userspace proxy on loopback adds a round trip between the client and the
# server (`target/release/delay_proxy`, half of it each way). For each round trip, PostgreSQL alone
# through the proxy (pgbench: one `INSERT ... ON CONFLICT DO NOTHING` of a random id per
# transaction, with as many clients as the server allows and with as many connections as a gateway
# holds), then stile through its own proxy (`storm --db-rtt-ms`: new ids at 1 per request x 256
# connections and 100 per request x 32, with its defaults and with each variant of flags given).
#
#   cargo build --release -p stile -p stile-bench --bin stile --bin storm --bin delay_proxy
#   bench/far/run.sh                 # RTTS="20 60" SECS=5 VARIANTS="--bundles-in-flight 4"
set -euo pipefail
cd "$(dirname "$0")/../.."
RTTS=${RTTS:-20 60}
SECS=${SECS:-5}
VARIANTS=${VARIANTS:---bundles-in-flight 4}
ALLOWED=${ALLOWED:-90}
HELD=${HELD:-24}
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
DB=stile_far_$$
work=$(mktemp -d)
proxy=
cleanup() {
  [ -n "$proxy" ] && kill "$proxy" 2>/dev/null && wait "$proxy" 2>/dev/null
  psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
psql -qX -d postgres -c "CREATE DATABASE $DB" >/dev/null
psql -qX -d "$DB" -c "CREATE TABLE log (id text PRIMARY KEY, payload jsonb NOT NULL)" >/dev/null
cat >"$work/insert.sql" <<'SQL'
\set id random(1, 2000000000)
INSERT INTO log (id, payload) VALUES (:client_id || '-' || :id, '{"n": 1}') ON CONFLICT DO NOTHING;
SQL
bins=target/release/stile
IFS=';' read -ra variants <<<"$VARIANTS"
for variant in "${variants[@]}"; do bins+=",target/release/stile@$variant"; done
for rtt in $RTTS; do
  target/release/delay_proxy --rtt-ms "$rtt" >"$work/proxy.out" 2>&1 &
  proxy=$!
  until grep -qs "listening on" "$work/proxy.out"; do sleep 0.1; done
  port=$(grep -oP 'listening on 127\.0\.0\.1:\K\d+' "$work/proxy.out")
  echo "## Round trip $rtt ms"
  for clients in "$ALLOWED" "$HELD"; do
    tps=$(pgbench -h 127.0.0.1 -p "$port" -n -c "$clients" -j 2 -T 30 -f "$work/insert.sql" "$DB" 2>&1 |
      grep -oP 'tps = \K[0-9.]+' | head -1)
    echo "PostgreSQL alone, pgbench, $clients clients: $tps msg/s"
  done
  kill "$proxy"; wait "$proxy" 2>/dev/null || true; proxy=
  target/release/storm --shapes 1x256,100x32 --mixed none --rounds 1 --warmup 1 --secs "$SECS" \
    --db-rtt-ms "$rtt" --bins "$bins" 2>"$work/storm-$rtt.err" | grep -E '^\| [0-9]+ \| [A-Z] \| .* \| new' || {
      tail -20 "$work/storm-$rtt.err" >&2
      exit 1
    }
done
