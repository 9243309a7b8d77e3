------------------------------------------------------------------------------
-- The push
------------------------------------------------------------------------------

-- The id of the message at index p_idx (from 0) of a log row's message_ids.
CREATE OR REPLACE FUNCTION stile.message_id_at(p_message_ids bytea, p_idx integer)
RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT encode(substring(p_message_ids FROM 16 * p_idx + 1 FOR 16), 'hex')::uuid
$$;

-- The floor of the hash at index p_k (from 0) of a segment's hash floors:
-- 8 bytes per hash, a big-endian bigint each. Inlined (see
-- stile.found_as_run).
CREATE OR REPLACE FUNCTION stile.floor_at(p_floors bytea, p_k integer)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ('x' || encode(substring(p_floors FROM 8 * p_k + 1 FOR 8), 'hex'))::bit(64)::bigint
$$;

-- The order a bundle's segments are processed in: ascending partition id, a
-- partition's segments in their order, so that row locks are taken in the
-- one global lock order. NULL when they are in that order already (a stile
-- gateway sends them so): then this is one pass of comparisons.
DROP FUNCTION IF EXISTS stile.push_order(bigint[], bigint[], integer[], integer[], bytea[], bytea[], text[], text[]);
CREATE OR REPLACE FUNCTION stile.lock_order(p_partition_ids bigint[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    FOR i IN 2 .. coalesce(cardinality(p_partition_ids), 0) LOOP
        IF p_partition_ids[i - 1] > p_partition_ids[i] THEN
            RETURN ARRAY(SELECT j FROM generate_series(1, cardinality(p_partition_ids)) AS j
                          ORDER BY p_partition_ids[j], j);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- A segment found as one run of a log row's hashes, the first at offset
-- p_offset: each hash's index, offset and message id, the ids from p_mids (the
-- row's message ids, or a slice of them) from index p_at on. One row. It is
-- declared a set (RETURNS TABLE) so that the planner inlines it into the
-- query that calls it: a LANGUAGE sql function that is not inlined is parsed
-- and planned again on every call.
DROP FUNCTION IF EXISTS stile.run_found(integer, bigint, bytea, integer);
CREATE OR REPLACE FUNCTION stile.found_as_run(
    p_count integer,
    p_offset bigint,
    p_mids bytea,
    p_at integer
)
RETURNS TABLE (dup_idx integer[], dup_off bigint[], dup_ids uuid[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ARRAY(SELECT generate_series(0, p_count - 1)),
           ARRAY(SELECT generate_series(p_offset, p_offset + p_count - 1)),
           ARRAY(SELECT stile.message_id_at(p_mids, p_at + j) FROM generate_series(0, p_count - 1) AS j)
$$;

-- A segment found hash by hash in a log row's hashes (p_haystack, the row's
-- or a slice of it whose first hash is at offset p_base; p_mids the same
-- span of its message ids), each by a byte search: every hash's index,
-- offset and message id, or NULLs when one is missing or matches only across
-- a hash boundary. A row's hashes are distinct: each occurs there once.
CREATE OR REPLACE FUNCTION stile.found_each(
    p_hashes bytea,
    p_haystack bytea,
    p_base bigint,
    p_mids bytea,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    v_at integer;  -- a hash's byte position in p_haystack, from 0
BEGIN
    dup_idx := '{}';
    dup_off := '{}';
    dup_ids := '{}';
    FOR j IN 0 .. length(p_hashes) / 16 - 1 LOOP
        v_at := position(substring(p_hashes FROM 16 * j + 1 FOR 16) IN p_haystack) - 1;
        IF v_at < 0 OR v_at % 16 <> 0 THEN
            dup_idx := NULL;
            dup_off := NULL;
            dup_ids := NULL;
            RETURN;
        END IF;
        dup_idx := dup_idx || j;
        dup_off := dup_off || (p_base + v_at / 16);
        dup_ids := dup_ids || stile.message_id_at(p_mids, v_at / 16);
    END LOOP;
END
$$;

-- What the cache vouches for under the partition's window: p_vouch (its
-- verified_upto, or -1 where the clock floor voids it) when it planned under
-- this window or a longer one, else nothing (-1). The cache vouched for
-- offsets whose hashes it held for the window it planned under; under a
-- longer window it may have let older ones go. The one place this rule is
-- written: the allocator's condition and the probe's bound both use it.
-- LANGUAGE sql and IMMUTABLE: it is inlined into the statement that calls it.
CREATE OR REPLACE FUNCTION stile.vouched_upto(p_vouch bigint, p_planned_window integer, p_window integer)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_window > p_planned_window THEN -1 ELSE p_vouch END
$$;

-- The offset above which a segment is probed: above what the cache vouches
-- for (stile.vouched_upto), never above the allocator at lock time (a later
-- segment of a partition in a bundle is probed against the earlier ones),
-- and never below the purge watermark. Inlined, as above.
DROP FUNCTION IF EXISTS stile.probe_from(bigint, integer, integer, timestamptz, timestamptz, bigint, bigint);
CREATE OR REPLACE FUNCTION stile.probe_from(p_vouched bigint, p_locked bigint, p_start bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT greatest(least(p_vouched, p_locked), p_start - 1)
$$;

-- The message ids of offsets p_base ..= p_end once retention removed them:
-- 16 zero bytes each, an id no UUIDv7 has, so that ids read across rows
-- keep their places. Inlined (see stile.floor_at).
CREATE OR REPLACE FUNCTION stile.no_message_ids(p_base bigint, p_end bigint)
RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT decode(repeat('00', 16 * (p_end - p_base + 1)::integer), 'hex')
$$;

-- The segment's hashes (p_hashes) each found above its own floor (p_floors,
-- see stile.floor_at), in the rows of partition p_pid inside the window
-- (created at or after p_since) with end_offset up to p_last, floors below
-- p_from raised to it (and every floor p_from where p_floors is NULL): per
-- hash, its index, its first occurrence's offset and that message's id
-- (NULL once retention removed it); NULLs unless every hash is found.
--
-- Each hash is looked for in the 128 offsets above its floor (up to
-- p_last), in the slices of them that the rows holding them hold (read
-- once for all the hashes of one floor); its first
-- aligned match there is its first occurrence above the floor, which
-- vouches for the rest. Rows that do not tile those offsets from the
-- floor's next one (an offset in no row), a row outside the window, a hash
-- not found, or one matched out of alignment, leave the segment to the
-- probe's other reads. Message ids removed by retention read as zeros (an id
-- no UUIDv7 has), so that the others keep their places.
CREATE OR REPLACE FUNCTION stile.found_above_floors(
    p_pid bigint,
    p_from bigint,
    p_last bigint,
    p_since timestamptz,
    p_hashes bytea,
    p_floors bytea,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- One statement for every hash (a loop of statements costs about 9 µs a
    -- hash, bench/storm/RESULTS.md): for each distinct floor, once, the rows
    -- that hold the 128 offsets above it, which must tile them from the
    -- floor's next offset without a gap and lie inside the window, and their
    -- slices of those offsets, concatenated; each hash is searched in its
    -- floor's, and its first match, aligned, is its first occurrence above
    -- the floor.
    WITH wanted AS (
        SELECT k, greatest(stile.floor_at(p_floors, k), p_from) AS fl, substring(p_hashes FROM 16 * k + 1 FOR 16) AS h
          FROM generate_series(0, length(p_hashes) / 16 - 1) AS k
    ), above AS (
        SELECT f.fl, g.hashes, g.mids
          FROM (SELECT DISTINCT w.fl FROM wanted w) AS f
         CROSS JOIN LATERAL (
             SELECT min(r.base_offset) AS base_offset,
                    sum(r.end_offset - r.base_offset + 1) = max(r.end_offset) - min(r.base_offset) + 1
                        AND bool_and(r.created_at >= p_since) AS held,
                    string_agg(substring(r.hashes FROM 16 * s.skip + 1 FOR 16 * s.n), '\x'::bytea ORDER BY r.end_offset) AS hashes,
                    string_agg(substring(coalesce(r.message_ids, stile.no_message_ids(r.base_offset, r.end_offset))
                                         FROM 16 * s.skip + 1 FOR 16 * s.n),
                               '\x'::bytea ORDER BY r.end_offset) AS mids
               FROM (SELECT r0.base_offset, r0.end_offset, r0.created_at, r0.hashes, r0.message_ids
                       FROM stile.log r0
                      WHERE r0.partition_id = p_pid AND r0.end_offset > f.fl AND r0.end_offset <= least(f.fl + 128, p_last)
                     UNION ALL
                     (SELECT r1.base_offset, r1.end_offset, r1.created_at, r1.hashes, r1.message_ids
                        FROM stile.log r1
                       WHERE r1.partition_id = p_pid AND r1.end_offset > f.fl + 128 AND r1.end_offset <= p_last
                       ORDER BY r1.end_offset
                       LIMIT 1)) AS r
              -- The row's slice of the offsets above the floor: where it
              -- starts in the row, and how many offsets it holds.
              CROSS JOIN LATERAL (SELECT greatest(f.fl + 1 - r.base_offset, 0)::integer AS skip,
                                         (least(r.end_offset, f.fl + 128) - greatest(r.base_offset, f.fl + 1) + 1)::integer AS n) AS s
              WHERE r.base_offset <= f.fl + 128) AS g
         WHERE g.base_offset <= f.fl + 1 AND g.held
    )
    SELECT array_agg(x.k ORDER BY x.k), array_agg(x.off ORDER BY x.k), array_agg(x.id ORDER BY x.k)
      INTO dup_idx, dup_off, dup_ids
      FROM (SELECT w.k, w.fl + 1 + m.at / 16 AS off,
                   nullif(stile.message_id_at(a.mids, m.at / 16), '00000000-0000-0000-0000-000000000000') AS id
              FROM wanted w
              JOIN above a ON a.fl = w.fl
             CROSS JOIN LATERAL (SELECT position(w.h IN a.hashes) - 1 AS at) AS m
             WHERE m.at >= 0 AND m.at % 16 = 0) AS x
    HAVING count(*) = length(p_hashes) / 16;
END
$$;

-- The probe of one segment, under its partition's row lock: its hashes
-- (p_hashes, 16 bytes each, distinct) against the log rows of the span, the
-- rows of the partition inside the window (created at or after p_now less
-- p_window seconds) with end_offset in (p_from, p_last]. Answers, per hash
-- found, its index in the segment, its first occurrence's offset (MIN over
-- the span) and that message's id (NULL once retention removed it); NULLs
-- when none is found.
--
-- It tries four strategies in turn, each a function of its own that answers
-- only when it is sure, the last one always:
--   1. stile.probe_retried_row, for a narrowed probe (p_narrowed: a retry the
--      cache floored at or just below its original): the span's first row;
--   2. stile.found_above_floors, given each hash's own floor (p_floors, 8
--      bytes per hash, see stile.floor_at and stile.held_floors): each hash
--      in the 128 offsets above its floor;
--   3. stile.probe_first_holding_row, for a narrowed probe or one of up to 4
--      hashes: the span's first row holding any of the first 4 hashes, when
--      no row below it holds another; then, for a narrowed probe without
--      floors, stile.found_above_floors with the vouch as every hash's floor;
--   4. stile.probe_span: every row of the span.
--
-- STABLE, as every strategy: every read of one probe sees the snapshot of
-- the statement that calls it, so that a probe without the partition's row
-- lock (stile.found_committed) reads the log as of the one moment it read
-- the partition's row.
DROP FUNCTION IF EXISTS stile.probe(bigint, bigint, bigint, integer, timestamptz, bytea, boolean);
CREATE OR REPLACE FUNCTION stile.probe(
    p_pid bigint,
    p_from bigint,
    p_last bigint,
    p_window integer,
    p_now timestamptz,
    p_hashes bytea,
    p_narrowed boolean,
    p_floors bytea,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_since timestamptz := p_now - make_interval(secs => p_window);
    v_decided boolean;
    v_settings text;       -- what set_config answered (unused)
BEGIN
    -- Five settings, transaction-local (a push is the transaction, or runs
    -- inside the caller's), set by one PL/pgSQL expression. No JIT: the
    -- planner prices the probe by guesswork (it cannot know how many hashes
    -- a row holds) and would spend far longer compiling the probe than
    -- running it. No merge join: it would sort every unnested hash together
    -- with its row's whole hashes value, gigabytes on disk for a large
    -- window; the hash join builds on the segment's few hashes instead. One
    -- plan per connection: the default plan cache mode plans the probe afresh
    -- on every call (no generic estimate of an offset range looks as cheap as
    -- a narrowed one), which costs more than running a retry's narrowed
    -- probe; the plan does not depend on the values (the offset range is its
    -- one index condition, the window's bound is applied above the fence).
    -- A generic plan is made from whatever the statistics say when a
    -- connection first probes (a table just bulk-loaded or reset can look
    -- empty, and a sequential scan then looks cheapest), so sequential scans
    -- are off for it, and the range is bounded on both sides, which prices it
    -- as narrow: its index is then always the primary key. Sorts are off too:
    -- priced as narrow, the one-row reads of the strategies could be planned as a bitmap
    -- scan of the whole span sorted for its first row; without a sort, the
    -- index's own order stops at the first row. Citus cannot plan a query
    -- over a distributed table generically: where it is loaded the plans
    -- stay the default's.
    v_settings := set_config('jit', 'off', true) || set_config('enable_mergejoin', 'off', true)
                  || set_config('plan_cache_mode',
                                CASE WHEN current_setting('citus.version', true) IS NULL
                                     THEN 'force_generic_plan' ELSE 'auto' END, true)
                  || set_config('enable_seqscan', 'off', true) || set_config('enable_sort', 'off', true);
    IF p_narrowed THEN
        SELECT f.dup_idx, f.dup_off, f.dup_ids INTO dup_idx, dup_off, dup_ids
          FROM stile.probe_retried_row(p_pid, p_from, p_last, v_since, p_hashes) AS f;
        IF dup_idx IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_floors IS NOT NULL THEN
        SELECT f.dup_idx, f.dup_off, f.dup_ids INTO dup_idx, dup_off, dup_ids
          FROM stile.found_above_floors(p_pid, p_from, p_last, v_since, p_hashes, p_floors) AS f;
        IF dup_idx IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_narrowed OR length(p_hashes) <= 4 * 16 THEN
        SELECT f.decided, f.dup_idx, f.dup_off, f.dup_ids INTO v_decided, dup_idx, dup_off, dup_ids
          FROM stile.probe_first_holding_row(p_pid, p_from, p_last, v_since, p_hashes) AS f;
        IF v_decided THEN
            RETURN;
        END IF;
    END IF;
    IF p_narrowed AND p_floors IS NULL THEN
        -- Before the whole span, a narrowed segment without floors of its
        -- own takes the cache's vouch as every hash's floor: replays of
        -- several requests stored side by side in small rows, floored
        -- together, are found in the rows just above it.
        SELECT f.dup_idx, f.dup_off, f.dup_ids INTO dup_idx, dup_off, dup_ids
          FROM stile.found_above_floors(p_pid, p_from, p_last, v_since, p_hashes, NULL) AS f;
        IF dup_idx IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    SELECT f.dup_idx, f.dup_off, f.dup_ids INTO dup_idx, dup_off, dup_ids
      FROM stile.probe_span(p_pid, p_from, p_last, v_since, p_hashes) AS f;
END
$$;

-- Strategy 1 of stile.probe: a retry, floored by the cache at most one
-- arrival step (16 offsets) below its original. The span's first row, the
-- one that holds offset p_from + 1, is read first, and of its hashes only
-- those from that offset on that the segment could cover (rows hold up to
-- thousands of hashes, out of line: a slice reads one or two of their
-- chunks). The segment found there whole is the answer: a row's hashes are
-- distinct, so each hash occurs there once, and no row of the span lies
-- below it. NULLs otherwise.
CREATE OR REPLACE FUNCTION stile.probe_retried_row(
    p_pid bigint,
    p_from bigint,
    p_last bigint,
    p_since timestamptz,
    p_hashes bytea,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_count integer := length(p_hashes) / 16;
    v_first_base bigint;   -- the span's first row
    v_first_mids bytea;    -- a slice of its message ids
    v_slice bytea;         -- a slice of its hashes
    v_at integer;          -- a hash's byte position in the slice, from 0
BEGIN
    SELECT f.base_offset,
           substring(f.hashes FROM 16 * (p_from + 1 - f.base_offset)::integer + 1 FOR 16 * (v_count + 15)),
           substring(f.message_ids FROM 16 * (p_from + 1 - f.base_offset)::integer + 1 FOR 16 * (v_count + 15))
      INTO v_first_base, v_slice, v_first_mids
      FROM (SELECT r.base_offset, r.end_offset, r.created_at, r.hashes, r.message_ids
              FROM stile.log r
             WHERE r.partition_id = p_pid
               AND r.end_offset > p_from
             ORDER BY r.end_offset
             LIMIT 1) AS f
     WHERE f.base_offset <= p_from + 1
       AND f.end_offset <= p_last
       AND f.created_at >= p_since;
    v_at := position(p_hashes IN v_slice) - 1;
    IF v_at >= 0 AND v_at % 16 = 0 AND v_count = 1 THEN
        -- A lone message's retry (one request, one message): three
        -- expressions instead of stile.found_as_run's query.
        dup_idx := '{0}';
        dup_off := ARRAY[p_from + 1 + v_at / 16];
        dup_ids := ARRAY[stile.message_id_at(v_first_mids, v_at / 16)];
        RETURN;
    ELSIF v_at >= 0 AND v_at % 16 = 0 THEN
        SELECT * INTO dup_idx, dup_off, dup_ids
          FROM stile.found_as_run(v_count, p_from + 1 + v_at / 16, v_first_mids, v_at / 16);
        RETURN;
    ELSIF v_slice IS NOT NULL AND v_count <= 64 THEN
        -- Hashes in another order, each searched for in the slice (at
        -- most 79 hashes long).
        SELECT * INTO dup_idx, dup_off, dup_ids
          FROM stile.found_each(p_hashes, v_slice, p_from + 1, v_first_mids);
        IF dup_idx IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
END
$$;

-- Strategy 3 of stile.probe, for a narrowed probe or a full one of up to 4
-- hashes (replays of old messages, which the cache floors at the start of a
-- large run or not at all): the span's first row whose bytes hold any of the
-- segment's first 4 hashes, when no row of the span below it holds any of
-- the others. Each hash's first occurrence is then there, and so are the
-- messages' ids. With at most 4 hashes, no row below the first holding any
-- of them holds another. decided: the answer stands (every hash found, or
-- none of up to 4 anywhere in the span); otherwise NULLs.
CREATE OR REPLACE FUNCTION stile.probe_first_holding_row(
    p_pid bigint,
    p_from bigint,
    p_last bigint,
    p_since timestamptz,
    p_hashes bytea,
    OUT decided boolean,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_count integer := length(p_hashes) / 16;
    v_h1 bytea;
    v_h2 bytea;
    v_h3 bytea;
    v_h4 bytea;
    v_first_base bigint;   -- the row found
    v_first_hashes bytea;
    v_first_mids bytea;    -- its message ids
    v_at integer;          -- a hash's byte position in that row, from 0
    v_run integer;         -- the segment's first hash's place in that row when
                           -- the segment is a run of it, else -1
    v_above bytea;         -- the hashes above p_from of the rows below that row
    v_below bigint;        -- hashes of the rows below that row found in the segment
BEGIN
    decided := false;
    -- The segment's first 4 hashes (absent ones NULL: a NULL needle is never
    -- searched for). A byte search per row costs far less than unnesting the
    -- row; it only preselects rows, and an aligned comparison decides.
    v_h1 := substring(p_hashes FROM 1 FOR 16);
    IF v_count >= 2 THEN v_h2 := substring(p_hashes FROM 17 FOR 16); END IF;
    IF v_count >= 3 THEN v_h3 := substring(p_hashes FROM 33 FOR 16); END IF;
    IF v_count >= 4 THEN v_h4 := substring(p_hashes FROM 49 FOR 16); END IF;
    -- The span's first row whose bytes hold any of the segment's first 4
    -- hashes, each row's hashes detoasted once, below the filter (each use
    -- of a toasted column fetches it anew). The fence keeps the index's
    -- order, so the limit still stops at the first row.
    SELECT t.base_offset, t.hashes, t.message_ids
      INTO v_first_base, v_first_hashes, v_first_mids
      FROM (SELECT r.base_offset, r.end_offset, r.hashes || '\x'::bytea AS hashes, r.message_ids
              FROM stile.log r
             WHERE r.partition_id = p_pid
               AND r.end_offset > p_from
               AND r.end_offset <= p_last
               AND r.created_at >= p_since
             ORDER BY r.end_offset
            OFFSET 0) AS t
     WHERE position(v_h1 IN t.hashes) > 0
        OR position(v_h2 IN t.hashes) > 0
        OR position(v_h3 IN t.hashes) > 0
        OR position(v_h4 IN t.hashes) > 0
     LIMIT 1;
    IF NOT FOUND AND v_count <= 4 THEN
        -- No row of the span holds any of the segment's hashes: the read
        -- of the whole span would find none either.
        decided := true;
        RETURN;
    END IF;
    IF FOUND AND position(substring(p_hashes FROM 16 * v_count - 15) IN v_first_hashes) = 0 THEN
        -- Without the segment's last hash the row cannot hold them all.
        v_first_base := NULL;
    END IF;
    -- Rows below it exist only when it starts above the span's first
    -- offset. Only their hashes above p_from can be the other hashes'
    -- earlier occurrences (the cache vouches for the rest), and a cache's
    -- floor is at most an arrival step below the original: those few
    -- hashes are looked for in the segment, rather than the segment's
    -- hashes each in the rows' whole bytes (a byte search costs its
    -- haystack's length). Those rows are read by their offset range
    -- alone, the window's bound applied above a fence: with both at one
    -- level, the generic plan read them through the created_at index,
    -- every row of the partition's window.
    IF v_first_base IS NOT NULL AND v_count > 4 AND v_first_base > p_from + 1 THEN
        SELECT string_agg(substring(r.hashes FROM 16 * greatest(p_from + 1 - r.base_offset, 0)::integer + 1), '\x'::bytea)
          INTO v_above
          FROM (SELECT r0.base_offset, r0.created_at, r0.hashes
                  FROM stile.log r0
                 WHERE r0.partition_id = p_pid
                   AND r0.end_offset > p_from
                   AND r0.end_offset < v_first_base
                OFFSET 0) AS r
         WHERE r.created_at >= p_since;
        IF v_count > 64 THEN
            -- A large segment: a byte search per hash below would cost
            -- the segment's length each time, so the hashes are joined
            -- with the segment's on equality instead, by hash, once each
            -- (aligned matches only: exactly the earlier occurrences).
            SELECT count(*) INTO v_below
              FROM stile.unnest_hashes(v_above) AS below
              JOIN stile.unnest_hashes(p_hashes) AS mine ON mine.h = below.h;
        ELSE
            -- (Any byte match counts here, aligned or not: it can only
            -- send the segment to the full span.)
            SELECT count(*) INTO v_below
              FROM generate_series(0, length(v_above) / 16 - 1) AS j
             WHERE position(substring(v_above FROM 16 * j + 1 FOR 16) IN p_hashes) > 0;
        END IF;
        IF v_below > 0 THEN
            v_first_base := NULL;
        END IF;
    END IF;
    IF v_first_base IS NOT NULL THEN
        -- The whole segment as one run of the row's hashes, at a hash
        -- boundary: a retry of a push stored as sent, the usual case,
        -- found by one byte search. A row's hashes are distinct (so are
        -- every segment's), so each hash occurs there only at its place
        -- in the run.
        v_at := position(p_hashes IN v_first_hashes) - 1;
        v_run := CASE WHEN v_at >= 0 AND v_at % 16 = 0 THEN v_at / 16 ELSE -1 END;
        IF v_run >= 0 THEN
            SELECT * INTO dup_idx, dup_off, dup_ids
              FROM stile.found_as_run(v_count, v_first_base + v_run, v_first_mids, v_run);
        ELSIF v_count <= 16 THEN
            -- A miss or an unaligned match leaves the segment to the full
            -- span.
            SELECT * INTO dup_idx, dup_off, dup_ids
              FROM stile.found_each(p_hashes, v_first_hashes, v_first_base, v_first_mids);
        ELSE
            SELECT array_agg(ih.idx ORDER BY ih.idx),
                   array_agg(v_first_base + th.idx ORDER BY ih.idx),
                   array_agg(stile.message_id_at(v_first_mids, th.idx) ORDER BY ih.idx)
              INTO dup_idx, dup_off, dup_ids
              FROM stile.unnest_hashes(p_hashes) AS ih
              JOIN (SELECT f.h, min(f.idx) AS idx
                      FROM stile.unnest_hashes(v_first_hashes) AS f
                     GROUP BY f.h) AS th ON th.h = ih.h;
        END IF;
        IF cardinality(dup_idx) = v_count THEN
            decided := true;
            RETURN;
        END IF;
        dup_idx := NULL;
        dup_off := NULL;
        dup_ids := NULL;
    END IF;
END
$$;

-- Strategy 4 of stile.probe, the one that always answers: every row of the
-- span, each row's hashes unnested and joined with the segment's, the first
-- occurrence of each by MIN. With up to 4 hashes, only the rows whose bytes
-- hold one of them are unnested.
CREATE OR REPLACE FUNCTION stile.probe_span(
    p_pid bigint,
    p_from bigint,
    p_last bigint,
    p_since timestamptz,
    p_hashes bytea,
    OUT dup_idx integer[],
    OUT dup_off bigint[],
    OUT dup_ids uuid[]
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_count integer := length(p_hashes) / 16;
    v_h1 bytea;
    v_h2 bytea;
    v_h3 bytea;
    v_h4 bytea;
BEGIN
    v_h1 := substring(p_hashes FROM 1 FOR 16);
    IF v_count >= 2 THEN v_h2 := substring(p_hashes FROM 17 FOR 16); END IF;
    IF v_count >= 3 THEN v_h3 := substring(p_hashes FROM 33 FOR 16); END IF;
    IF v_count >= 4 THEN v_h4 := substring(p_hashes FROM 49 FOR 16); END IF;
    SELECT array_agg(d.idx ORDER BY d.idx),
           array_agg(d.off ORDER BY d.idx),
           array_agg(o.mid ORDER BY d.idx)
      INTO dup_idx, dup_off, dup_ids
      FROM (SELECT ih.idx, min(t.base_offset + th.idx) AS off
              FROM (SELECT t2.base_offset, t2.hashes
                      FROM (SELECT t1.base_offset,
                                   -- detoasted once per row, not once per use
                                   t1.hashes || '\x'::bytea AS hashes
                              FROM (SELECT t0.base_offset, t0.created_at, t0.hashes
                                      FROM stile.log t0
                                     WHERE t0.partition_id = p_pid
                                       AND t0.end_offset > p_from
                                       AND t0.end_offset <= p_last
                                    OFFSET 0) AS t1
                             WHERE t1.created_at >= p_since
                            OFFSET 0) AS t2
                     WHERE v_count > 4
                        OR position(v_h1 IN t2.hashes) > 0
                        OR position(v_h2 IN t2.hashes) > 0
                        OR position(v_h3 IN t2.hashes) > 0
                        OR position(v_h4 IN t2.hashes) > 0
                    OFFSET 0) AS t
             CROSS JOIN LATERAL stile.unnest_hashes(t.hashes) AS th
              JOIN stile.unnest_hashes(p_hashes) AS ih ON ih.h = th.h
             GROUP BY ih.idx) AS d
      LEFT JOIN LATERAL (
            SELECT stile.message_id_at(s.message_ids, (d.off - s.base_offset)::integer) AS mid
              FROM stile.log s
             WHERE s.partition_id = p_pid AND s.end_offset >= d.off
             ORDER BY s.end_offset
             LIMIT 1) AS o ON true;
END
$$;

-- The columns of a log row holding a segment's messages less its duplicates
-- (p_dup_idx, indexes from 0), in their order, and whether the segment's two
-- JSON arrays hold one element per hash (the one place they are parsed).
-- One row, declared a set so that it is inlined (see stile.found_as_run).
DROP FUNCTION IF EXISTS stile.kept(bytea, bytea, text, text, integer[]);
CREATE OR REPLACE FUNCTION stile.kept_columns(
    p_hashes bytea,
    p_message_ids bytea,
    p_transaction_ids text,
    p_payloads text,
    p_dup_idx integer[]
)
RETURNS TABLE (hashes bytea, message_ids bytea, transaction_ids text, payloads text, complete boolean)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT string_agg(substring(p_hashes FROM 16 * k.j + 1 FOR 16), '\x'::bytea ORDER BY k.j),
           string_agg(substring(p_message_ids FROM 16 * k.j + 1 FOR 16), '\x'::bytea ORDER BY k.j),
           '[' || string_agg(t.e::text, ',' ORDER BY k.j) || ']',
           '[' || string_agg(p.e::text, ',' ORDER BY k.j) || ']',
           json_array_length(p_transaction_ids::json) = length(p_hashes) / 16
           AND json_array_length(p_payloads::json) = length(p_hashes) / 16
      FROM generate_series(0, length(p_hashes) / 16 - 1) AS k(j)
      JOIN json_array_elements(p_transaction_ids::json) WITH ORDINALITY AS t(e, n) ON t.n = k.j + 1
      JOIN json_array_elements(p_payloads::json) WITH ORDINALITY AS p(e, n) ON p.n = k.j + 1
     WHERE k.j <> ALL (p_dup_idx)
$$;

-- The earliest clock at which a bundle's vouches hold, from the cache's
-- clock floor in ms since the epoch: never for NULL (or past the largest
-- timestamp), always below 0. Inlined, as above.
CREATE OR REPLACE FUNCTION stile.vouches_hold_from(p_clock_floor_ms bigint)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_clock_floor_ms IS NULL OR p_clock_floor_ms > 253402300799999 THEN 'infinity'::timestamptz
                WHEN p_clock_floor_ms < 0 THEN '-infinity'::timestamptz
                ELSE to_timestamp(p_clock_floor_ms / 1000.0) END
$$;

-- The cache's vouch for a segment (its p_verified), or -1 (none) where this
-- database's clock (p_now) is behind the floor it assumed: it judged which
-- hashes are older than the window by that time. Inlined, as above.
CREATE OR REPLACE FUNCTION stile.vouch(p_verified bigint, p_now timestamptz, p_holds_from timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_now < p_holds_from THEN -1 ELSE greatest(coalesce(p_verified, -1), -1) END
$$;

-- A segment's hash floors where the cache's vouches hold (a vouch of 0
-- survives stile.vouch's clock rule and stile.vouched_upto's window rule),
-- else NULL. A hash's floor may be -1 (nothing at or below -1) where the
-- segment's vouch, its lowest floor, is none. Inlined, as above.
CREATE OR REPLACE FUNCTION stile.held_floors(
    p_floors bytea,
    p_now timestamptz,
    p_holds_from timestamptz,
    p_planned_window integer,
    p_window integer
)
RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN stile.vouched_upto(stile.vouch(0, p_now, p_holds_from), p_planned_window, p_window) = 0
                THEN p_floors END
$$;

-- Whether a segment has the shape stile.push takes: a partition, at least one
-- message, 16 bytes of hash and of message id per message, its
-- transactionIds and payloads, and no hash floors or 8 bytes of them per
-- message. Inlined, as above.
DROP FUNCTION IF EXISTS stile.segment_well_formed(bigint, integer, bytea, bytea, text, text);
CREATE OR REPLACE FUNCTION stile.segment_well_formed(
    p_partition_id bigint,
    p_count integer,
    p_hashes bytea,
    p_message_ids bytea,
    p_transaction_ids text,
    p_payloads text,
    p_hash_floors bytea
)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(p_partition_id IS NOT NULL AND p_count >= 1
                    AND length(p_hashes) = 16 * p_count AND length(p_message_ids) = 16 * p_count
                    AND p_transaction_ids IS NOT NULL AND p_payloads IS NOT NULL
                    AND coalesce(length(p_hash_floors) = 8 * p_count, true), false)
$$;

-- How a segment is probed, from its partition's window (p_window), allocator
-- (p_last) and purge watermark (p_start) and the bound from stile.probe_from:
-- 'off' (window 0), 'skipped' (nothing stored above the bound), 'narrowed'
-- (the bound set by the cache's vouch) or 'full' (the bound at the purge
-- watermark). Inlined, as above.
CREATE OR REPLACE FUNCTION stile.probe_kind(p_window integer, p_last bigint, p_from bigint, p_start bigint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_window = 0 THEN 'off' WHEN p_last <= p_from THEN 'skipped'
                WHEN p_from >= p_start THEN 'narrowed' ELSE 'full' END
$$;

-- Whether a segment's verdict needs no probe: window 0, nothing stored above
-- the purge watermark (p_start), or the cache vouches (p_vouched, from
-- stile.vouched_upto) for every stored offset. Exactly when stile.probe_kind
-- answers 'off' or 'skipped' for the bound stile.probe_from gives with the
-- allocator itself as p_locked. Inlined into the allocator's condition.
CREATE OR REPLACE FUNCTION stile.nothing_to_probe(p_window integer, p_last bigint, p_start bigint, p_vouched bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_window = 0 OR p_last < p_start OR p_last <= p_vouched
$$;

-- Whether each of a bundle's per-segment arrays holds p_n elements (a NULL
-- array holds none), the hash floors none at all or p_n. Inlined, as above.
DROP FUNCTION IF EXISTS stile.bundle_aligned(integer, bigint[], integer[], integer[], bytea[], bytea[], text[], text[]);
CREATE OR REPLACE FUNCTION stile.bundle_aligned(
    p_n integer,
    p_verified bigint[],
    p_planned_windows integer[],
    p_counts integer[],
    p_hashes bytea[],
    p_message_ids bytea[],
    p_transaction_ids text[],
    p_payloads text[],
    p_hash_floors bytea[]
)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(cardinality(p_hash_floors), p_n) = p_n AND p_n = ALL (ARRAY[coalesce(cardinality(p_verified), 0), coalesce(cardinality(p_planned_windows), 0),
                            coalesce(cardinality(p_counts), 0), coalesce(cardinality(p_hashes), 0),
                            coalesce(cardinality(p_message_ids), 0), coalesce(cardinality(p_transaction_ids), 0),
                            coalesce(cardinality(p_payloads), 0)])
$$;

-- The verdict on a segment of replays (every hash one the cache has seen)
-- from what is committed, without the partition's row lock: one row of its
-- window, how it was probed, and every hash's original, or no row unless
-- every hash is found (then only the locked path can decide). The
-- partition's row and the log are read in one snapshot (this function and
-- the probe are STABLE: their statements see the snapshot of the statement
-- calling them), and the probe's span ends at the allocator of that row,
-- whose offsets are all committed in it: nothing another session writes
-- later lies below it. ARCHITECTURE.md (invariant 1) says why this verdict
-- is the one the lock would give. The row is read by a statement of its own
-- and the probe called by another: Citus runs a statement over one shard
-- whole on that shard, where the probe's reads of the log could not run.
CREATE OR REPLACE FUNCTION stile.found_committed(
    p_pid bigint,
    p_vouch bigint,
    p_planned_window integer,
    p_now timestamptz,
    p_holds_from timestamptz,
    p_hashes bytea,
    p_floors bytea
)
RETURNS TABLE (window_seconds integer, probe text, dup_idx integer[], dup_off bigint[], dup_ids uuid[])
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_window integer;
    v_last bigint;
    v_start bigint;
    v_from bigint;
    v_kind text;
BEGIN
    SELECT p.dedup_window_seconds, p.last_offset, p.txns_start INTO v_window, v_last, v_start
      FROM stile.partitions p
     WHERE p.id = p_pid;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_from := stile.probe_from(stile.vouched_upto(p_vouch, p_planned_window, v_window), v_last, v_start);
    v_kind := stile.probe_kind(v_window, v_last, v_from, v_start);
    IF v_kind NOT IN ('narrowed', 'full') THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v_window, v_kind, f.dup_idx, f.dup_off, f.dup_ids
      FROM stile.probe(p_pid, v_from, v_last, v_window, p_now, p_hashes, v_kind = 'narrowed',
                       stile.held_floors(p_floors, p_now, p_holds_from, p_planned_window, v_window)) AS f
     WHERE cardinality(f.dup_idx) = length(p_hashes) / 16;
END
$$;

-- The columns of a log row holding segment p_seg's messages less its
-- duplicates (stile.kept_columns). A segment whose JSON arrays do not hold
-- one element per hash fails the call, and with it the bundle: nothing of a
-- malformed bundle is stored.
CREATE OR REPLACE FUNCTION stile.kept_segment(
    p_seg integer,
    p_hashes bytea,
    p_message_ids bytea,
    p_transaction_ids text,
    p_payloads text,
    p_dup_idx integer[],
    OUT hashes bytea,
    OUT message_ids bytea,
    OUT transaction_ids text,
    OUT payloads text
)
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_complete boolean;
BEGIN
    SELECT k.hashes, k.message_ids, k.transaction_ids, k.payloads, k.complete
      INTO hashes, message_ids, transaction_ids, payloads, v_complete
      FROM stile.kept_columns(p_hashes, p_message_ids, p_transaction_ids, p_payloads, p_dup_idx) AS k;
    IF NOT v_complete THEN
        RAISE EXCEPTION 'stile.push: segment % does not hold % transactionIds and payloads', p_seg, length(p_hashes) / 16
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- Pushes a bundle of segments, for one or several partitions, in one
-- transaction. Segment i (1-based in the arrays, reported 0-based as `seg`):
--   p_partition_ids[i]    its partition
--   p_verified[i]         the offset at or below which the gateway's cache
--                         vouches that none of its hashes occurs (-1: none)
--   p_planned_windows[i]  the dedup window (s) the cache planned under
--   p_counts[i]           its number of messages (>= 1)
--   p_hashes[i]           its messages' 16-byte hashes, concatenated
--   p_message_ids[i]      its messages' ids, 16 bytes each, concatenated
--   p_transaction_ids[i]  its messages' transactionIds, a JSON array
--   p_payloads[i]         its messages' payloads, a JSON array
--   p_hash_floors[i]      NULL, or for each of its hashes (8 bytes each, a
--                         big-endian bigint) the offset at or below which the
--                         cache vouches that that hash does not occur, each
--                         at or above p_verified[i] (the array itself may be
--                         NULL: no segment has them)
--   p_replays[i]          whether every hash of it is one the cache has seen
--                         (likely all duplicates; the array may be NULL: no
--                         segment is)
-- p_route is the partition by which a distributed database routes the call
-- (any partition of the bundle: a bundle holds partitions of one node); it
-- decides nothing here. p_clock_floor_ms is what the cache assumed of this
-- database's clock when it planned the bundle (its `now` less its skew slack,
-- in ms since the epoch): it judged which hashes are older than the window by
-- that time, so its vouches hold only while clock_timestamp() is at or past
-- it. Behind it (a gateway whose bound of this clock ran ahead, or this clock
-- stepped back), every p_verified is ignored and the window is probed in
-- full.
--
-- Only a stile gateway calls this function: it has validated every payload
-- and transactionId and computed the hashes, and they are stored as sent,
-- not parsed again. The shapes are checked (counts, bytes per hash and id),
-- and a bundle that fails a check is refused whole.
--
-- Segments are processed in ascending partition order (a partition's in
-- their order), so row locks are taken in the one global lock order, and
-- their rows are returned in that order. For each, under its partition's row
-- lock, before anything is allocated: the probe runs over the log rows inside
-- the window with end_offset above stile.probe_from(...) when that span is
-- not empty. A duplicate writes nothing; the segment returns, per duplicate,
-- its index in the segment, the original's offset (MIN over all occurrences)
-- and the original's message id (NULL only if retention removed it). The
-- segment's other messages, n of them in their order, are proven new by the
-- same probe (a segment's hashes are distinct): they are allocated
-- last_offset + 1 .. last_offset + n and written as one log row (hashes even
-- with the window at 0), and base_offset and created_ms say where and when.
-- A segment of duplicates only returns no base_offset.
--
-- A segment of replays of a partition this call has not locked is first
-- judged from what is committed, without the lock (stile.found_committed):
-- when every hash is found there, that is its verdict (probe 'committed'),
-- and a call whose segments are all judged so takes no lock, writes nothing
-- and commits without a transaction id. Otherwise the lock decides.
--
-- The first segment of each partition tries the verdict and the allocation
-- as one statement: the allocator's UPDATE is conditioned on the verdict
-- (window 0, or a vouch that is not void and covers every stored offset),
-- which PostgreSQL evaluates on the row it locks, the latest version.
-- Otherwise the row is locked and the probe decides.
--
-- probe: 'off' (window 0), 'skipped' (nothing above the bound), 'narrowed'
-- (bound set by p_verified), 'full' (bound set by txns_start or -1) or
-- 'committed' (every hash found without the lock; only for p_replays).
-- clock_ms is clock_timestamp() when the segment was probed, in ms since the
-- epoch, rounded down: a reading of this database's clock, from which a
-- gateway bounds it (guest/src/clock.rs).
-- The hash floors and the replays came last, with defaults, so that the
-- gateways of the builds before them keep calling this function unchanged
-- (and are never answered 'committed', which they do not know).
DROP FUNCTION IF EXISTS stile.push(bigint, bigint[], bigint[], integer[], integer[], bytea[], bytea[], text[], text[], bigint);
DROP FUNCTION IF EXISTS stile.push(bigint, bigint[], bigint[], integer[], integer[], bytea[], bytea[], text[], text[], bigint, bytea[]);
CREATE OR REPLACE FUNCTION stile.push(
    p_route bigint,
    p_partition_ids bigint[],
    p_verified bigint[],
    p_planned_windows integer[],
    p_counts integer[],
    p_hashes bytea[],
    p_message_ids bytea[],
    p_transaction_ids text[],
    p_payloads text[],
    p_clock_floor_ms bigint,
    p_hash_floors bytea[] DEFAULT NULL,
    p_replays boolean[] DEFAULT NULL
)
RETURNS TABLE (
    seg integer,
    base_offset bigint,
    created_ms bigint,
    window_seconds integer,
    probe text,
    dup_idx integer[],
    dup_off bigint[],
    dup_ids uuid[],
    clock_ms bigint
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(p_partition_ids), 0);
    v_order integer[] := stile.lock_order(p_partition_ids);
    v_holds_from timestamptz := stile.vouches_hold_from(p_clock_floor_ms);
    i integer;
    v_pid bigint;
    v_locked_pid bigint;  -- the partition whose row this call holds and reads below
    v_locked bigint;      -- its allocator at lock time
    v_last bigint;        -- its allocator, kept current through the bundle
    v_start bigint;       -- its purge watermark
    v_window integer;     -- its queue's window (read under the lock)
    v_count integer;      -- the segment's messages, then those it stores
    v_now timestamptz;
    v_vouch bigint;       -- p_verified, or -1 where the clock floor voids it
    v_planned integer;    -- the window the cache planned under
    v_from bigint;        -- the bound the probe reads above
    v_allocated boolean;  -- whether the verdict and the allocation were one statement
    v_committed boolean;  -- whether the verdict came from what is committed, unlocked
    v_row stile.log%ROWTYPE;    -- the log row of a segment stored
    v_rows stile.log[] := '{}';  -- the log rows of the segments stored, not yet written
    v_stored boolean := false;  -- whether any segment stored a log row
BEGIN
    IF NOT stile.bundle_aligned(v_n, p_verified, p_planned_windows, p_counts, p_hashes, p_message_ids,
                                p_transaction_ids, p_payloads, p_hash_floors)
       OR coalesce(cardinality(p_replays), v_n) <> v_n THEN
        RAISE EXCEPTION 'stile.push: the per-segment arrays differ in length' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR j IN 1 .. v_n LOOP
        i := coalesce(v_order[j], j);
        v_pid := p_partition_ids[i];
        v_count := p_counts[i];
        -- A malformed segment fails the call, which rolls back every segment
        -- before it: the bundle is refused whole.
        IF NOT stile.segment_well_formed(v_pid, v_count, p_hashes[i], p_message_ids[i], p_transaction_ids[i], p_payloads[i],
                                         p_hash_floors[i]) THEN
            RAISE EXCEPTION 'stile.push: segment % has % messages, % hash bytes, % message id bytes and % hash floor bytes',
                i - 1, v_count, length(p_hashes[i]), length(p_message_ids[i]), length(p_hash_floors[i])
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_now := clock_timestamp();
        -- What does not depend on the partition's row is computed here, once:
        -- PostgreSQL compiles a statement's condition on every run.
        v_vouch := stile.vouch(p_verified[i], v_now, v_holds_from);
        v_planned := coalesce(p_planned_windows[i], 0);
        seg := i - 1;
        clock_ms := floor(extract(epoch FROM v_now) * 1000)::bigint;
        base_offset := NULL; created_ms := NULL; dup_idx := NULL; dup_off := NULL; dup_ids := NULL;
        v_allocated := false;
        v_committed := false;
        IF p_replays[i] AND v_pid IS DISTINCT FROM v_locked_pid THEN
            SELECT c.window_seconds, c.probe, c.dup_idx, c.dup_off, c.dup_ids
              INTO window_seconds, probe, dup_idx, dup_off, dup_ids
              FROM stile.found_committed(v_pid, v_vouch, v_planned, v_now, v_holds_from, p_hashes[i], p_hash_floors[i]) AS c;
            v_committed := FOUND;
            IF v_committed THEN
                probe := 'committed';
                v_count := 0;
            END IF;
        END IF;
        IF NOT v_committed AND v_pid IS DISTINCT FROM v_locked_pid THEN
            -- Lock: the verdict and the allocation are one statement where the
            -- allocator's condition holds on the row the UPDATE locks (its
            -- latest version); otherwise the row is locked and the probe decides.
            UPDATE stile.partitions p
               SET last_offset = p.last_offset + v_count
             WHERE p.id = v_pid
               AND stile.nothing_to_probe(p.dedup_window_seconds, p.last_offset, p.txns_start,
                                          stile.vouched_upto(v_vouch, v_planned, p.dedup_window_seconds))
            RETURNING p.last_offset, p.txns_start, p.dedup_window_seconds INTO v_last, v_start, v_window;
            v_allocated := FOUND;
            IF NOT v_allocated THEN
                SELECT p.last_offset, p.txns_start, p.dedup_window_seconds INTO v_last, v_start, v_window
                  FROM stile.partitions p WHERE p.id = v_pid FOR UPDATE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'stile.push: unknown partition id %', v_pid USING ERRCODE = 'foreign_key_violation';
                END IF;
            END IF;
            v_locked_pid := v_pid;
            v_locked := v_last - CASE WHEN v_allocated THEN v_count ELSE 0 END;
        END IF;
        IF NOT v_committed THEN
            -- Bound the probe (nothing lies above an allocation just made),
            -- probe, and allocate what it proved new.
            v_from := CASE WHEN v_allocated THEN v_last
                           ELSE stile.probe_from(stile.vouched_upto(v_vouch, v_planned, v_window), v_locked, v_start) END;
            probe := stile.probe_kind(v_window, v_last, v_from, v_start);
            IF probe IN ('narrowed', 'full') THEN
                SELECT r.dup_idx, r.dup_off, r.dup_ids INTO dup_idx, dup_off, dup_ids
                  FROM stile.probe(v_pid, v_from, v_last, v_window, v_now, p_hashes[i], probe = 'narrowed',
                                   stile.held_floors(p_hash_floors[i], v_now, v_holds_from, v_planned, v_window)) AS r;
                v_count := v_count - coalesce(cardinality(dup_idx), 0);
            END IF;
            IF NOT v_allocated AND v_count > 0 THEN
                v_last := v_last + v_count;
                UPDATE stile.partitions SET last_offset = v_last WHERE id = v_pid;
            END IF;
            window_seconds := v_window;
        END IF;
        IF v_count > 0 THEN
            -- Store: one log row of its messages less its duplicates, in
            -- order, written with the call's other rows below.
            v_row.partition_id := v_pid;
            v_row.end_offset := v_last;
            v_row.base_offset := v_last - v_count + 1;
            v_row.created_at := v_now;
            IF dup_idx IS NULL THEN
                v_row.hashes := p_hashes[i];
                v_row.message_ids := p_message_ids[i];
                v_row.transaction_ids := p_transaction_ids[i];
                v_row.payloads := p_payloads[i];
            ELSE
                SELECT k.* INTO v_row.hashes, v_row.message_ids, v_row.transaction_ids, v_row.payloads
                  FROM stile.kept_segment(i - 1, p_hashes[i], p_message_ids[i], p_transaction_ids[i], p_payloads[i], dup_idx) AS k;
            END IF;
            v_rows := v_rows || v_row;
            base_offset := v_row.base_offset;
            -- Rounded up, so that no cache expires a hash before SQL would.
            created_ms := ceil(extract(epoch FROM v_now) * 1000)::bigint;
            v_stored := true;
        END IF;
        RETURN NEXT;
        -- The rows stored, in order, by one INSERT at the end of the call (a
        -- statement's start costs more than the row it writes), or sooner
        -- when the next segment is of this partition: its probe reads them.
        IF cardinality(v_rows) > 0 AND (j = v_n OR p_partition_ids[coalesce(v_order[j + 1], j + 1)] = v_pid) THEN
            INSERT INTO stile.log (partition_id, end_offset, base_offset, created_at, hashes, message_ids, transaction_ids, payloads)
            SELECT r.partition_id, r.end_offset, r.base_offset, r.created_at, r.hashes, r.message_ids, r.transaction_ids, r.payloads
              FROM unnest(v_rows) AS r;
            v_rows := '{}';
        END IF;
    END LOOP;
    -- A call that stored nothing wrote only row locks, and every original it
    -- named was durable before it was visible: where each call is a
    -- transaction of its own (a gateway's shard connections say so), its
    -- commit need not wait for its WAL to be flushed.
    IF NOT v_stored AND current_setting('stile.autocommit_push', true) = 'on' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END
$$;

-- The previous build's signature: messages flat over the bundle, payloads as
-- json. Its gateways keep calling it while an operator upgrades gateways one
-- at a time; it repacks each segment as stile.push above takes it and answers
-- in segment order, as those gateways expect. Once no gateway of that build
-- remains, `DROP FUNCTION stile.push(bigint[], bigint[], integer[],
-- integer[], bytea[], uuid[], text[], json[], bigint)` retires it (a later
-- migration will).
CREATE OR REPLACE FUNCTION stile.push(
    p_partition_ids bigint[],
    p_verified bigint[],
    p_planned_windows integer[],
    p_counts integer[],
    p_hashes bytea[],
    p_message_ids uuid[],
    p_transaction_ids text[],
    p_payloads json[],
    p_clock_floor_ms bigint
)
RETURNS TABLE (
    seg integer,
    base_offset bigint,
    created_ms bigint,
    window_seconds integer,
    probe text,
    dup_idx integer[],
    dup_off bigint[],
    dup_ids uuid[],
    clock_ms bigint
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_partition_ids), 0);
    v_total integer := 0;
    v_count integer;
    v_msg integer := 1;
    v_mids bytea[] := '{}';
    v_tids text[] := '{}';
    v_payloads text[] := '{}';
BEGIN
    IF coalesce(cardinality(p_counts), 0) <> v_n THEN
        RAISE EXCEPTION 'stile.push: the per-segment arrays differ in length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. v_n LOOP
        v_total := v_total + greatest(coalesce(p_counts[i], 0), 0);
    END LOOP;
    IF coalesce(cardinality(p_message_ids), 0) <> v_total
       OR coalesce(cardinality(p_transaction_ids), 0) <> v_total
       OR coalesce(cardinality(p_payloads), 0) <> v_total THEN
        RAISE EXCEPTION 'stile.push: % messages counted, % message ids, % transaction ids and % payloads given',
            v_total, coalesce(cardinality(p_message_ids), 0), coalesce(cardinality(p_transaction_ids), 0),
            coalesce(cardinality(p_payloads), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. v_n LOOP
        v_count := greatest(coalesce(p_counts[i], 0), 0);
        v_mids := v_mids || decode(replace(array_to_string(p_message_ids[v_msg : v_msg + v_count - 1], ''), '-', ''), 'hex');
        v_tids := v_tids || array_to_json(p_transaction_ids[v_msg : v_msg + v_count - 1])::text;
        v_payloads := v_payloads || array_to_json(p_payloads[v_msg : v_msg + v_count - 1])::text;
        v_msg := v_msg + v_count;
    END LOOP;
    RETURN QUERY
        SELECT r.seg, r.base_offset, r.created_ms, r.window_seconds, r.probe, r.dup_idx, r.dup_off, r.dup_ids, r.clock_ms
          FROM stile.push(p_partition_ids[1], p_partition_ids, p_verified, p_planned_windows, p_counts, p_hashes,
                          v_mids, v_tids, v_payloads, p_clock_floor_ms) AS r
         ORDER BY r.seg;
END
$$;
