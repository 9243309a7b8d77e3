#!/usr/bin/env bash
# KV reads in PostgreSQL: stile.kv_apply answering one get, one getMany of
# three keys, one getPrefix page of a small namespace and one short page of a
# namespace of 200,000 keys, each run by pgbench (prepared, 2 clients) for
# SECS seconds. Creates its database with a gateway of this build (which
# installs the schema and functions), drops it at the end.
#
#   cargo build --release -p stile && bench/sql/kv_reads.sh [SECS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-5}"
db="stile_t_kv_reads_$$"
conn=(-h "${PGHOST:-127.0.0.1}" -U "${PGUSER:-postgres}")
psql "${conn[@]}" -d postgres -qc "CREATE DATABASE $db"
trap 'psql "${conn[@]}" -d postgres -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
port=$((20000 + $$ % 20000))
target/release/stile serve --listen "127.0.0.1:$port" \
    --database-url "host=${PGHOST:-127.0.0.1} user=${PGUSER:-postgres} dbname=$db" >/dev/null 2>&1 &
gateway=$!
until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    kill -0 "$gateway" 2>/dev/null || { echo "the gateway exited before it served" >&2; exit 1; }
    sleep 0.2
done
kill "$gateway"; wait "$gateway" || true
psql "${conn[@]}" -d "$db" -q -o /dev/null <<'SQL'
SELECT stile.kv_apply(jsonb_build_array(
    jsonb_build_object('op', 'put', 'ns', 'n', 'key', 'k1', 'value', 1),
    jsonb_build_object('op', 'put', 'ns', 'n', 'key', 'k2', 'value', 2),
    jsonb_build_object('op', 'put', 'ns', 'n', 'key', 'k3', 'value', 3)), NULL);
INSERT INTO stile.kv (ns, key, value, version, expires_at, updated_at)
SELECT 'big', 'a' || lpad(g::text, 7, '0'), '1', g, NULL, now() FROM generate_series(1, 200000) g;
ANALYZE stile.kv;
SQL
dir=$(mktemp -d)
echo "SELECT stile.kv_apply('[{\"op\":\"get\",\"ns\":\"n\",\"key\":\"k1\"}]', NULL);" > "$dir/get.sql"
echo "SELECT stile.kv_apply('[{\"op\":\"getMany\",\"ns\":\"n\",\"keys\":[\"k1\",\"k2\",\"k9\"]}]', NULL);" > "$dir/getMany.sql"
# (pgbench reads ":name" as a variable: the JSON keeps a space after each colon before a literal.)
echo "SELECT stile.kv_apply('[{\"op\":\"getPrefix\",\"ns\":\"n\",\"prefix\":\"k\",\"limit\": 10}]', NULL);" > "$dir/getPrefix.sql"
echo "SELECT stile.kv_apply('[{\"op\":\"getPrefix\",\"ns\":\"big\",\"prefix\":\"a000001\",\"limit\": 20}]', NULL);" > "$dir/getPrefix-large.sql"
for name in get getMany getPrefix getPrefix-large; do
    tps=$(pgbench "${conn[@]}" -n -M prepared -c 2 -j 2 -T "$secs" -f "$dir/$name.sql" "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    printf '%-16s %10s calls/s\n' "$name" "$tps"
done
rm -r "$dir"
