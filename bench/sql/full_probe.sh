#!/usr/bin/env bash
# A full probe (no vouch) of two replayed ids scattered in one log row of
# 4,096 hashes, run by pgbench (prepared, 2 clients, 4 s): the push function
# answers both as duplicates and stores nothing. With REV, the push function
# of that commit is installed over this build's first.
#
#   cargo build --release -p stile && bench/sql/full_probe.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/../.."
rev="${1:-}"
source bench/sql/fresh_database.sh full_probe
if [ -n "$rev" ]; then git show "$rev:host/sql/functions/push.sql" | psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null; fi
psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null <<'SQL'
SELECT stile.resolve_partition('q', 'p0');
SELECT stile.push(1, ARRAY[1::bigint], ARRAY[-1]::bigint[], ARRAY[3600], ARRAY[4096],
    ARRAY[(SELECT string_agg(decode(md5(i::text), 'hex'), ''::bytea ORDER BY i) FROM generate_series(0, 4095) i)],
    ARRAY[(SELECT string_agg(uuid_send(gen_random_uuid()), ''::bytea) FROM generate_series(0, 4095))],
    ARRAY[(SELECT json_agg('t' || i ORDER BY i)::text FROM generate_series(0, 4095) i)],
    ARRAY[(SELECT json_agg(i ORDER BY i)::text FROM generate_series(0, 4095) i)], NULL);
SQL
f=$(mktemp)
cat > "$f" <<'SQL'
\set a random(0, 2047)
\set b random(2048, 4095)
SELECT count(*) FROM stile.push(1, ARRAY[1::bigint], ARRAY[-1]::bigint[], ARRAY[3600], ARRAY[2],
    ARRAY[decode(md5(:a::text), 'hex') || decode(md5(:b::text), 'hex')],
    ARRAY[uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())],
    ARRAY['["x", "y"]'], ARRAY['[1, 2]'], NULL);
SQL
pgbench "${conn[@]}" -n -M prepared -c 2 -j 2 -T 4 -f "$f" "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1 calls\/s/p'
echo "stored: $(psql "${conn[@]}" -d "$db" -Atc "SELECT count(*) - 1 FROM stile.log") rows after the first"
rm "$f"
