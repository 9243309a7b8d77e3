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
source bench/sql/fresh_database.sh kv_reads
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
