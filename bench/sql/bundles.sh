#!/usr/bin/env bash
# What stile.push costs per segment in a bundle of many partitions' one-message
# segments, each vouched for (the batch-1 shape: every request a segment of its
# own partition, the verdict and the allocation one statement). A procedure
# pushes BUNDLES bundles of SEGMENTS such segments, each bundle its own
# transaction, in one session (no round trips: only the server's work), and
# prints microseconds per segment; the same loop without the push call is
# measured beside it, so that its own cost can be subtracted. With REV, that
# commit's push function is installed beside this build's (as
# stile.push_previous) and the two alternate in one run, ROUNDS times.
#
#   cargo build --release -p stile && bench/sql/bundles.sh [ROUNDS] [REV] [SEGMENTS] [BUNDLES]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-6}"
rev="${2:-}"
segments="${3:-28}"
bundles="${4:-200}"
source bench/sql/fresh_database.sh bundles
if [ -n "$rev" ]; then
    git show "$rev:host/sql/functions/push.sql" | python3 -c '
import sys
s = sys.stdin.read()
start = s.index("CREATE OR REPLACE FUNCTION stile.push(\n    p_route bigint,")
end = s.index("$$;", start) + 3
print(s[start:end].replace("FUNCTION stile.push(", "FUNCTION stile.push_previous(", 1))
' | psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null
fi
psql "${conn[@]}" -d "$db" -q -v ON_ERROR_STOP=1 -o /dev/null -v segments="$segments" <<'SQL'
SELECT stile.resolve_partition('q', 'p' || g) FROM generate_series(1, :segments) g;
CREATE PROCEDURE bundles(p_function text, p_bundles integer, p_segments integer, INOUT p_us float8 DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    v_started timestamptz;
    v_ids bigint[] := ARRAY(SELECT id FROM stile.partitions ORDER BY id LIMIT p_segments);
    v_verified bigint[];
    v_hashes bytea[];
    v_ids_bytes bytea[];
    v_windows integer[] := array_fill(3600, ARRAY[p_segments]);
    v_counts integer[] := array_fill(1, ARRAY[p_segments]);
    v_txns text[] := array_fill('["t-0123456789abcdef"]'::text, ARRAY[p_segments]);
    v_payloads text[] := array_fill('[{"order": 1, "amount": 99.5, "currency": "EUR"}]'::text, ARRAY[p_segments]);
    v_stored integer;
BEGIN
    v_started := clock_timestamp();
    FOR b IN 1 .. p_bundles LOOP
        v_verified := ARRAY(SELECT last_offset FROM stile.partitions WHERE id = ANY (v_ids) ORDER BY id);
        v_hashes := ARRAY(SELECT decode(md5(random()::text), 'hex') FROM generate_series(1, p_segments));
        v_ids_bytes := ARRAY(SELECT uuid_send(gen_random_uuid()) FROM generate_series(1, p_segments));
        -- Static calls (an EXECUTE would parse and plan each one): a branch
        -- not taken is never planned, so stile.push_previous may be missing.
        IF p_function = 'stile.push' THEN
            SELECT count(r.base_offset) INTO v_stored
              FROM stile.push(v_ids[1], v_ids, v_verified, v_windows, v_counts, v_hashes, v_ids_bytes, v_txns, v_payloads, 0) AS r;
        ELSIF p_function = 'stile.push_previous' THEN
            SELECT count(r.base_offset) INTO v_stored
              FROM stile.push_previous(v_ids[1], v_ids, v_verified, v_windows, v_counts, v_hashes, v_ids_bytes, v_txns, v_payloads, 0) AS r;
        ELSE
            v_stored := p_segments;
        END IF;
        IF v_stored <> p_segments THEN
            RAISE EXCEPTION '% stored % of % segments', p_function, v_stored, p_segments;
        END IF;
        COMMIT;
    END LOOP;
    p_us := extract(epoch FROM clock_timestamp() - v_started) * 1e6 / p_bundles / p_segments;
END
$$;
SQL
functions=(none stile.push)
[ -n "$rev" ] && functions+=(stile.push_previous)
# Each round starts one function further along the list, so that none always
# runs first; the medians come last.
n=${#functions[@]}
results=$(mktemp)
for r in $(seq 1 "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
        f=${functions[$(((r + k) % n))]}
        us=$(psql "${conn[@]}" -d "$db" -Atq -c "SET synchronous_commit = off" -c "CALL bundles('$f', $bundles, $segments)")
        printf '%-20s round %d: %8.1f us per segment\n' "$f" "$r" "$us" | tee -a "$results"
    done
done
for f in "${functions[@]}"; do
    grep "^$f " "$results" | awk '{print $(NF-3)}' | sort -n |
        awk -v f="$f" '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%-20s median %8.1f us per segment over %d rounds\n", f, m, NR}'
done
rm "$results"
