#!/usr/bin/env bash
# The reads that run per request or per background pass in PostgreSQL, each
# run by pgbench (prepared, 2 clients) for SECS seconds: a page of 100
# messages from a random offset of a partition holding 10,000 (100 log rows),
# a hydration of that partition, a page of 50 of 1,000 pending timers, the
# next timer's due time, and the retention pass's candidate list. With REV,
# the functions of that commit are installed over this build's first, so a
# previous function set is measured on the same data.
#
#   cargo build --release -p stile && bench/sql/reads.sh [SECS] [REV]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:-5}"
rev="${2:-}"
source bench/sql/fresh_database.sh reads
if [ -n "$rev" ]; then
    for f in partitions push configure reads retention kv timers; do
        git show "$rev:host/sql/functions/$f.sql"
    done | psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null
fi
psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null <<'SQL'
SELECT stile.configure('q', '{"retentionSeconds": 86400}');
SELECT stile.resolve_partition('q', 'p0');
DO $$
DECLARE
    v_pid bigint := (SELECT id FROM stile.partitions WHERE name = 'p0');
BEGIN
    FOR r IN 0 .. 99 LOOP
        PERFORM stile.push(v_pid, ARRAY[v_pid], ARRAY[-1]::bigint[], ARRAY[3600], ARRAY[100],
            ARRAY[(SELECT string_agg(decode(md5(r || '-' || i), 'hex'), ''::bytea)
                     FROM generate_series(1, 100) i)],
            ARRAY[(SELECT string_agg(uuid_send(gen_random_uuid()), ''::bytea) FROM generate_series(1, 100))],
            ARRAY[(SELECT json_agg('t-' || r || '-' || i)::text FROM generate_series(1, 100) i)],
            ARRAY[(SELECT json_agg(json_build_object('order', r, 'line', i, 'amount', 99.5))::text
                     FROM generate_series(1, 100) i)],
            NULL);
    END LOOP;
END
$$;
INSERT INTO stile.timers (queue, timer_key, partition, txn, message_id, payload, deliver_at, scheduled_at)
SELECT 'q', 'k' || lpad(g::text, 5, '0'), 'p0', 't' || g, gen_random_uuid(), '{"a": 1}',
       now() + interval '1 hour', now()
  FROM generate_series(1, 1000) g;
ANALYZE;
SQL
dir=$(mktemp -d)
echo '\set from random(0, 9899)' > "$dir/read_messages.sql"
echo "SELECT * FROM stile.read_messages('q', 'p0', :from, 100);" >> "$dir/read_messages.sql"
echo "SELECT * FROM stile.hydration((SELECT id FROM stile.partitions WHERE name = 'p0'), 3600, 5000);" > "$dir/hydration.sql"
echo "SELECT stile.timers_list('q', 'k00500', 50);" > "$dir/timers_list.sql"
echo "SELECT stile.timers_next_due_ms();" > "$dir/timers_next_due.sql"
echo "SELECT stile.purge_candidates();" > "$dir/purge_candidates.sql"
for name in read_messages hydration timers_list timers_next_due purge_candidates; do
    tps=$(pgbench "${conn[@]}" -n -M prepared -c 2 -j 2 -T "$secs" -f "$dir/$name.sql" "$db" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    printf '%-18s %10s calls/s\n' "$name" "$tps"
done
rm -r "$dir"
