-- stile schema, version 2: the functions the gateway calls.
--
-- Re-applied whenever this text changes (see host/src/db/migrate.rs), so
-- every definition is CREATE OR REPLACE. A function whose arguments change
-- is a new function beside the old one, which gateways of an older build
-- keep calling; a change of the return type alone needs a versioned
-- migration that drops the old one first.
--
-- Every function that writes takes partition row locks with SELECT ... FOR
-- UPDATE, several only in ascending id order: the one global lock order.

------------------------------------------------------------------------------
-- Queues and partitions
------------------------------------------------------------------------------

-- Returns a partition's id, its queue's dedup window, its allocator and its
-- purge watermark, creating the queue (from defaults) and the partition on
-- first use. Race-safe: INSERT ... ON CONFLICT DO NOTHING waits for a
-- concurrent creator, and the SELECT after it (a new snapshot) sees its row.
CREATE OR REPLACE FUNCTION stile.resolve_partition(
    p_queue text,
    p_partition text,
    OUT partition_id bigint,
    OUT window_seconds integer,
    OUT last_offset bigint,
    OUT txns_start bigint
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    SELECT p.id, q.dedup_window_seconds, p.last_offset, p.txns_start
      INTO partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
      JOIN stile.queues q ON q.name = p.queue
     WHERE p.queue = p_queue AND p.name = p_partition;
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_partition IS NULL OR p_partition = '' OR octet_length(p_partition) > 255
       OR p_partition ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'partition: a partition name is 1 to 255 bytes without control characters'
            USING ERRCODE = 'check_violation', COLUMN = 'partition';
    END IF;
    INSERT INTO stile.queues (name) VALUES (p_queue) ON CONFLICT DO NOTHING;
    INSERT INTO stile.partitions (queue, name) VALUES (p_queue, p_partition) ON CONFLICT DO NOTHING;
    SELECT p.id, q.dedup_window_seconds, p.last_offset, p.txns_start
      INTO STRICT partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
      JOIN stile.queues q ON q.name = p.queue
     WHERE p.queue = p_queue AND p.name = p_partition;
END
$$;

------------------------------------------------------------------------------
-- The push
------------------------------------------------------------------------------

-- Pushes a bundle of segments, for one or several partitions, in one
-- transaction. Segment i (1-based in the arrays, reported 0-based as `seg`):
--   p_partition_ids[i]    its partition
--   p_verified[i]         the offset at or below which the gateway's cache
--                         vouches that none of its hashes occurs (-1: none)
--   p_planned_windows[i]  the dedup window (s) the cache planned under
--   p_counts[i]           its number of messages (>= 1)
--   p_hashes[i]           its messages' 16-byte hashes, concatenated
-- and, flat over all segments in order, one element per message,
-- p_message_ids, p_transaction_ids and p_payloads. p_clock_floor_ms is what
-- the cache assumed of this database's clock when it planned the bundle (its
-- `now` less its skew slack, in ms since the epoch): it judged which hashes
-- are older than the window by that time, so its vouches hold only while
-- clock_timestamp() is at or past it. Behind it (a gateway whose bound of
-- this clock ran ahead, or this clock stepped back), every p_verified is
-- ignored and the window is probed in full.
--
-- All partition rows are locked first, in ascending id order. Then, segment by
-- segment in order: the probe runs (under the lock, before allocation) over
-- txns rows inside the window with end_offset above
-- GREATEST(p_verified, txns_start - 1) when that span is not empty. A
-- duplicate writes nothing; the segment returns, per duplicate, its index in
-- the segment, the original's offset (MIN over all occurrences) and the
-- original's message id (NULL only if retention removed that segment). The
-- segment's other messages, n of them in their order, are proven new by the
-- same probe (a segment's hashes are distinct): they are allocated
-- last_offset + 1 .. last_offset + n and written as one segments row and one
-- txns row (txns even with the window at 0), and base_offset and created_ms
-- say where and when. A segment of duplicates only returns no base_offset.
--
-- A narrowed probe reads one row alone when that row holds every hash of the
-- segment (a retry floored at or just below its original by the cache): the
-- span's first row inside the window whose bytes hold any of the segment's
-- first 4 hashes, when no row of the span below it holds any of the others.
-- Each hash's first occurrence is then there. Otherwise it reads every row of
-- the span.
--
-- Exactness rules beyond the plain probe:
--   * a clock behind p_clock_floor_ms voids p_verified (see above);
--   * a window larger than the one the cache planned under voids p_verified
--     (a cache that expired under a shorter window cannot vouch for a longer);
--   * p_verified is clamped to the partition's last_offset at lock time: the
--     cache vouched for offsets that existed when it planned, so a later
--     segment of the same partition in the same bundle is always probed
--     against the earlier segments' rows.
--
-- probe: 'off' (window 0), 'skipped' (nothing above the bound), 'narrowed'
-- (bound set by p_verified) or 'full' (bound set by txns_start or -1).
-- clock_ms is clock_timestamp() when the segment was probed, in ms since the
-- epoch, rounded down: a reading of this database's clock, from which a
-- gateway bounds it (guest/src/clock.rs).
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
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(p_partition_ids), 0);
    v_total integer := 0;
    -- The bundle's partitions, ascending, as locked: their allocator (kept
    -- current through the bundle), allocator at lock time, purge watermark
    -- and window (read once, under the lock: nothing changes them until
    -- COMMIT but this function; a configure committed meanwhile applies to
    -- the next bundle).
    v_ids bigint[];
    v_last bigint[];
    v_locked bigint[];
    v_start bigint[];
    v_windows integer[];
    k integer;
    v_l bigint;
    v_s bigint;
    v_pid bigint;
    v_base bigint;
    v_count integer;
    v_keep integer;  -- the segment's messages that are not duplicates
    v_hashes bytea;
    v_keep_mids uuid[];
    v_keep_tids text[];
    v_keep_payloads json[];
    v_window integer;
    v_from bigint;
    v_now timestamptz;
    -- The earliest clock at which the cache's vouches hold (none for NULL).
    v_floor timestamptz := CASE WHEN p_clock_floor_ms IS NULL OR p_clock_floor_ms > 253402300799999 THEN 'infinity'
                                WHEN p_clock_floor_ms < 0 THEN '-infinity'
                                ELSE to_timestamp(p_clock_floor_ms / 1000.0) END;
    v_msg integer := 1;  -- first message of the current segment in the flat arrays
    v_idx integer[];
    v_off bigint[];
    v_mid uuid[];
    v_probe text;
    v_h1 bytea;
    v_h2 bytea;
    v_h3 bytea;
    v_h4 bytea;
    v_first_base bigint;   -- the row tried alone first
    v_first_hashes bytea;
    v_at integer;          -- a hash's byte position in that row, from 0
    v_run integer;         -- the segment's first hash's place in that row when
                           -- the segment is a run of it, else -1
    v_row_mids uuid[];     -- that row's message ids
    v_settings text;       -- what set_config answered (unused)
    v_below bigint;        -- hashes of the rows below that row found in the segment
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_verified), 0) <> v_n
       OR coalesce(cardinality(p_planned_windows), 0) <> v_n
       OR coalesce(cardinality(p_counts), 0) <> v_n
       OR coalesce(cardinality(p_hashes), 0) <> v_n THEN
        RAISE EXCEPTION 'stile.push: the per-segment arrays differ in length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. v_n LOOP
        v_count := p_counts[i];
        IF v_count IS NULL OR v_count < 1 OR length(p_hashes[i]) IS DISTINCT FROM 16 * v_count THEN
            RAISE EXCEPTION 'stile.push: segment % has % messages and % hash bytes',
                i - 1, v_count, length(p_hashes[i])
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_total := v_total + v_count;
    END LOOP;
    IF coalesce(cardinality(p_message_ids), 0) <> v_total
       OR coalesce(cardinality(p_transaction_ids), 0) <> v_total
       OR coalesce(cardinality(p_payloads), 0) <> v_total THEN
        RAISE EXCEPTION 'stile.push: % messages counted, % message ids, % transaction ids and % payloads given',
            v_total, coalesce(cardinality(p_message_ids), 0), coalesce(cardinality(p_transaction_ids), 0),
            coalesce(cardinality(p_payloads), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The bundle pre-lock, in ascending id order, before anything else. One
    -- statement per partition, with a scalar parameter: PL/pgSQL keeps a
    -- generic plan for it (a single statement over the array would be
    -- planned afresh on every call).
    IF v_n = 1 THEN
        v_ids := p_partition_ids;
    ELSE
        SELECT array_agg(DISTINCT x ORDER BY x) INTO v_ids FROM unnest(p_partition_ids) AS x;
    END IF;
    v_last := array_fill(NULL::bigint, ARRAY[cardinality(v_ids)]);
    v_start := v_last;
    v_windows := array_fill(NULL::integer, ARRAY[cardinality(v_ids)]);
    FOR j IN 1 .. cardinality(v_ids) LOOP
        v_pid := v_ids[j];
        SELECT p.last_offset, p.txns_start,
               (SELECT q.dedup_window_seconds FROM stile.queues q WHERE q.name = p.queue)
          INTO v_l, v_s, v_window
          FROM stile.partitions p
         WHERE p.id = v_pid
           FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'stile.push: unknown partition id %', v_pid
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        v_last[j] := v_l;
        v_start[j] := v_s;
        v_windows[j] := v_window;
    END LOOP;
    v_locked := v_last;

    FOR i IN 1 .. v_n LOOP
        v_pid := p_partition_ids[i];
        k := array_position(v_ids, v_pid);
        v_count := p_counts[i];
        v_hashes := p_hashes[i];
        v_window := v_windows[k];
        v_now := clock_timestamp();
        v_idx := NULL;
        v_off := NULL;
        v_mid := NULL;

        IF v_window = 0 THEN
            v_probe := 'off';
        ELSE
            -- The cache planned under a shorter window, or judged age by a
            -- time this clock has not reached: it may have expired hashes
            -- the current window still holds, so it vouches for nothing.
            -- And it vouched for offsets that existed when it
            -- planned: a later segment of this bundle is probed against
            -- earlier ones. The probe starts above that bound or below the
            -- purge watermark, whichever is higher, and is narrowed when the
            -- bound is. (One expression: each PL/pgSQL statement costs
            -- about a microsecond, on the path every vouched push takes.)
            v_from := greatest(least(CASE WHEN v_window > coalesce(p_planned_windows[i], 0) OR v_now < v_floor THEN -1
                                          ELSE greatest(coalesce(p_verified[i], -1), -1) END,
                                     v_locked[k]),
                               v_start[k] - 1);
            IF v_last[k] <= v_from THEN
                v_probe := 'skipped';
            ELSE
                v_probe := CASE WHEN v_from >= v_start[k] THEN 'narrowed' ELSE 'full' END;
                -- Five settings, transaction-local (this call is the
                -- transaction), set by one PL/pgSQL expression (a PERFORM
                -- would execute a statement). No JIT: the planner prices the
                -- probe by guesswork (it cannot know how many hashes a row
                -- holds) and would spend far longer compiling the probe than
                -- running it. No merge join: it would sort every unnested
                -- hash together with its row's whole hashes value (64 KiB
                -- per 4,096-hash row), gigabytes on disk for a large window;
                -- the hash join builds on the segment's few hashes instead.
                -- And one plan per connection: the default plan cache mode
                -- plans the probe afresh on every call (no generic estimate
                -- of an offset range looks as cheap as a narrowed one), which
                -- costs more than running a retry's narrowed probe. The plan
                -- does not depend on the values: the offset range is its one
                -- index condition (the window's bound is applied above the
                -- fence below), and the join builds on the segment's hashes.
                -- A generic plan is made from whatever the statistics say
                -- when a connection first probes (a table just bulk-loaded
                -- or reset can look empty, and a sequential scan of every
                -- partition's rows then looks cheapest), so sequential scans
                -- are off for it, and the range is bounded on both sides (the
                -- allocator above excludes nothing), which prices it as
                -- narrow: its index is then always end_offset's. Sorts are
                -- off too: priced as narrow, the one-row read below could be
                -- planned as a bitmap scan of the whole span sorted for its
                -- first row; without a sort, the index's own order stops at
                -- the first row.
                v_settings := set_config('jit', 'off', true) || set_config('enable_mergejoin', 'off', true)
                              || set_config('plan_cache_mode', 'force_generic_plan', true)
                              || set_config('enable_seqscan', 'off', true) || set_config('enable_sort', 'off', true);
                -- The segment's first 4 hashes (absent ones NULL: a NULL
                -- needle is never searched for). A byte search per row costs
                -- far less than unnesting the row; it only preselects rows,
                -- and an aligned comparison decides.
                v_h1 := substring(v_hashes FROM 1 FOR 16);
                v_h2 := NULL; v_h3 := NULL; v_h4 := NULL;
                IF v_count >= 2 THEN v_h2 := substring(v_hashes FROM 17 FOR 16); END IF;
                IF v_count >= 3 THEN v_h3 := substring(v_hashes FROM 33 FOR 16); END IF;
                IF v_count >= 4 THEN v_h4 := substring(v_hashes FROM 49 FOR 16); END IF;
                -- A narrowed probe tries one row alone, first: the span's
                -- first row inside the window whose bytes hold any of the
                -- first 4 hashes (no row below it holds one of those). The
                -- cache floors a local hit at or just below its original,
                -- so for a retry that row usually holds every hash of the
                -- segment. When it does, and no row below it holds one of
                -- the other hashes (checked only past 4 hashes, and only in
                -- the rows below it, a step of the cache's floor), it holds
                -- each one's first occurrence in the span, and no other row
                -- needs reading.
                IF v_probe = 'narrowed' THEN
                    -- (No fence around the scan: the limit must stop it
                    -- at the first row, in the index's order.)
                    SELECT r.base_offset, r.hashes || '\x'::bytea
                      INTO v_first_base, v_first_hashes
                      FROM stile.txns r
                     WHERE r.partition_id = v_pid
                       AND r.end_offset > v_from
                       AND r.end_offset <= v_last[k]
                       AND r.created_at >= v_now - make_interval(secs => v_window)
                       AND (position(v_h1 IN r.hashes) > 0
                            OR position(v_h2 IN r.hashes) > 0
                            OR position(v_h3 IN r.hashes) > 0
                            OR position(v_h4 IN r.hashes) > 0)
                     ORDER BY r.end_offset
                     LIMIT 1;
                    -- Rows below it exist only when it starts above the
                    -- span's first offset. Only their hashes above v_from
                    -- can be the other hashes' earlier occurrences (the
                    -- cache vouches for the rest), and a cache's floor is
                    -- at most an arrival step below the original: those few
                    -- hashes are looked for in the segment, rather than the
                    -- segment's hashes each in the rows' whole bytes (a
                    -- byte search costs its haystack's length, so that
                    -- would read a row once for every hash of the segment).
                    IF FOUND AND v_count > 64 AND v_first_base > v_from + 1 THEN
                        -- A large segment: a byte search per row hash would
                        -- cost the segment's length each time (a 4,096-hash
                        -- retry spent a tenth of a second here), so the rows'
                        -- hashes above v_from are joined with the segment's
                        -- on equality instead, by hash, once each (aligned
                        -- matches only: exactly the earlier occurrences).
                        -- Counted rather than limited to one: for a LIMIT the
                        -- planner would pick a nested loop over both lists.
                        -- (The rows' hashes above v_from are cut once per
                        -- row, behind the fence.)
                        SELECT count(*) INTO v_below
                          FROM (SELECT substring(r.hashes FROM 16 * greatest(v_from + 1 - r.base_offset, 0)::integer + 1)
                                       AS above
                                  FROM stile.txns r
                                 WHERE r.partition_id = v_pid
                                   AND r.end_offset > v_from
                                   AND r.end_offset < v_first_base
                                   AND r.created_at >= v_now - make_interval(secs => v_window)
                                OFFSET 0) AS b
                         CROSS JOIN LATERAL stile.unnest_hashes(b.above) AS below
                          JOIN stile.unnest_hashes(v_hashes) AS mine ON mine.h = below.h;
                        IF v_below > 0 THEN
                            v_first_base := NULL;
                        END IF;
                    ELSIF FOUND AND v_count > 4 AND v_first_base > v_from + 1 THEN
                        -- (Any byte match counts here, aligned or not: it can
                        -- only send the segment to the full span.)
                        PERFORM 1
                           FROM (SELECT substring(r.hashes FROM 16 * greatest(v_from + 1 - r.base_offset, 0)::integer + 1)
                                        AS above
                                   FROM stile.txns r
                                  WHERE r.partition_id = v_pid
                                    AND r.end_offset > v_from
                                    AND r.end_offset < v_first_base
                                    AND r.created_at >= v_now - make_interval(secs => v_window)
                                 OFFSET 0) AS b
                          WHERE EXISTS (SELECT 1 FROM generate_series(0, length(b.above) / 16 - 1) AS j
                                         WHERE position(substring(b.above FROM 16 * j + 1 FOR 16) IN v_hashes) > 0)
                          LIMIT 1;
                        IF FOUND THEN
                            v_first_base := NULL;
                        END IF;
                    END IF;
                    IF v_first_base IS NOT NULL THEN
                        -- The whole segment as one run of the row's hashes,
                        -- at a hash boundary: a retry of a push stored as
                        -- sent, the usual case, found by one byte search. A
                        -- row's hashes are distinct (so are every segment's),
                        -- so each hash occurs there only at its place in
                        -- the run.
                        v_at := position(v_hashes IN v_first_hashes) - 1;
                        v_run := CASE WHEN v_at >= 0 AND v_at % 16 = 0 THEN v_at / 16 ELSE -1 END;
                        IF v_run >= 0 AND v_count <= 16 THEN
                            -- (Expressions, no statement, as below.)
                            v_idx := '{}';
                            v_off := '{}';
                            FOR j IN 0 .. v_count - 1 LOOP
                                v_idx := v_idx || j;
                                v_off := v_off || (v_first_base + v_run + j);
                            END LOOP;
                        ELSIF v_run >= 0 THEN
                            -- (Two series as arrays, already in their order:
                            -- aggregating them with ORDER BY would sort each.)
                            SELECT ARRAY(SELECT generate_series(0, v_count - 1)),
                                   ARRAY(SELECT generate_series(v_first_base + v_run, v_first_base + v_run + v_count - 1))
                              INTO v_idx, v_off;
                        ELSIF v_count <= 16 THEN
                            -- Each hash's first occurrence in the row by a
                            -- byte search, a few PL/pgSQL expressions each
                            -- (no statement to execute, cheaper than the join
                            -- below at this size); a miss or an unaligned
                            -- match leaves the segment to the full span.
                            v_idx := '{}';
                            v_off := '{}';
                            FOR j IN 0 .. v_count - 1 LOOP
                                v_at := position(substring(v_hashes FROM 16 * j + 1 FOR 16) IN v_first_hashes) - 1;
                                EXIT WHEN v_at < 0 OR v_at % 16 <> 0;
                                v_idx := v_idx || j;
                                v_off := v_off || (v_first_base + v_at / 16);
                            END LOOP;
                        ELSE
                            SELECT array_agg(ih.idx ORDER BY ih.idx),
                                   array_agg(v_first_base + th.idx ORDER BY ih.idx)
                              INTO v_idx, v_off
                              FROM stile.unnest_hashes(v_hashes) AS ih
                              JOIN (SELECT f.h, min(f.idx) AS idx
                                      FROM stile.unnest_hashes(v_first_hashes) AS f
                                     GROUP BY f.h) AS th ON th.h = ih.h;
                        END IF;
                        IF cardinality(v_idx) = v_count THEN
                            -- The row's messages are the segments row of the
                            -- same base (gone only if retention removed it),
                            -- read once for all of them.
                            v_row_mids := NULL;
                            SELECT s.message_ids INTO v_row_mids
                              FROM stile.segments s
                             WHERE s.partition_id = v_pid AND s.base_offset = v_first_base;
                            IF v_run >= 0 THEN
                                v_mid := v_row_mids[v_run + 1 : v_run + v_count];
                                IF v_row_mids IS NULL THEN
                                    v_mid := array_fill(NULL::uuid, ARRAY[v_count]);
                                END IF;
                            ELSIF v_count <= 16 THEN
                                v_mid := array_fill(NULL::uuid, ARRAY[v_count]);
                                FOR j IN 1 .. v_count LOOP
                                    v_mid[j] := v_row_mids[(v_off[j] - v_first_base + 1)::integer];
                                END LOOP;
                            ELSE
                                v_mid := ARRAY(SELECT v_row_mids[(o.off - v_first_base + 1)::integer]
                                                 FROM unnest(v_off) WITH ORDINALITY AS o(off, n)
                                                ORDER BY o.n);
                            END IF;
                        ELSE
                            v_idx := NULL;
                            v_off := NULL;
                        END IF;
                    END IF;
                END IF;
                IF v_idx IS NULL THEN
                    SELECT array_agg(d.idx ORDER BY d.idx),
                           array_agg(d.off ORDER BY d.idx),
                           array_agg(o.mid ORDER BY d.idx)
                      INTO v_idx, v_off, v_mid
                      FROM (SELECT ih.idx, min(t.base_offset + th.idx) AS off
                              FROM (SELECT t2.base_offset, t2.hashes
                                      FROM (SELECT t1.base_offset,
                                                   -- detoasted once per row, not once per use
                                                   t1.hashes || '\x'::bytea AS hashes
                                              FROM (SELECT t0.base_offset, t0.created_at, t0.hashes
                                                      FROM stile.txns t0
                                                     WHERE t0.partition_id = v_pid
                                                       AND t0.end_offset > v_from
                                                       AND t0.end_offset <= v_last[k]
                                                    OFFSET 0) AS t1
                                             WHERE t1.created_at >= v_now - make_interval(secs => v_window)
                                            OFFSET 0) AS t2
                                     WHERE v_count > 4
                                        OR position(v_h1 IN t2.hashes) > 0
                                        OR position(v_h2 IN t2.hashes) > 0
                                        OR position(v_h3 IN t2.hashes) > 0
                                        OR position(v_h4 IN t2.hashes) > 0
                                    OFFSET 0) AS t
                             CROSS JOIN LATERAL stile.unnest_hashes(t.hashes) AS th
                              JOIN stile.unnest_hashes(v_hashes) AS ih ON ih.h = th.h
                             GROUP BY ih.idx) AS d
                      LEFT JOIN LATERAL (
                            SELECT s.message_ids[(d.off - s.base_offset + 1)::integer] AS mid
                              FROM stile.segments s
                             WHERE s.partition_id = v_pid AND s.base_offset <= d.off
                             ORDER BY s.base_offset DESC
                             LIMIT 1) AS o ON true;
                END IF;
            END IF;
        END IF;

        seg := i - 1;
        window_seconds := v_window;
        probe := v_probe;
        dup_idx := v_idx;
        dup_off := v_off;
        dup_ids := v_mid;
        clock_ms := floor(extract(epoch FROM v_now) * 1000)::bigint;
        base_offset := NULL;
        created_ms := NULL;
        v_keep := v_count - coalesce(cardinality(v_idx), 0);
        IF v_keep > 0 THEN
            IF v_idx IS NOT NULL THEN
                -- Some duplicates: the others are written without them, in
                -- their order, in this same transaction (rather than sent
                -- again in another round trip).
                SELECT array_agg(p_message_ids[v_msg + j] ORDER BY j),
                       array_agg(p_transaction_ids[v_msg + j] ORDER BY j),
                       array_agg(p_payloads[v_msg + j] ORDER BY j),
                       string_agg(substring(v_hashes FROM 16 * j + 1 FOR 16), '\x'::bytea ORDER BY j)
                  INTO v_keep_mids, v_keep_tids, v_keep_payloads, v_hashes
                  FROM generate_series(0, v_count - 1) AS j
                 WHERE j <> ALL (v_idx);
            END IF;
            v_base := v_last[k] + 1;
            v_last[k] := v_last[k] + v_keep;
            -- One statement with scalar parameters only: PL/pgSQL settles on
            -- a generic plan for it, so nothing is planned per call.
            WITH allocate AS (
                UPDATE stile.partitions SET last_offset = v_last[k] WHERE id = v_pid
            ), segment AS (
                INSERT INTO stile.segments
                       (partition_id, base_offset, end_offset, created_at, message_ids, transaction_ids, payloads)
                VALUES (v_pid, v_base, v_last[k], v_now,
                        CASE WHEN v_idx IS NULL THEN p_message_ids[v_msg : v_msg + v_count - 1] ELSE v_keep_mids END,
                        CASE WHEN v_idx IS NULL THEN p_transaction_ids[v_msg : v_msg + v_count - 1] ELSE v_keep_tids END,
                        CASE WHEN v_idx IS NULL THEN p_payloads[v_msg : v_msg + v_count - 1] ELSE v_keep_payloads END)
            )
            INSERT INTO stile.txns (partition_id, base_offset, end_offset, created_at, hashes)
            VALUES (v_pid, v_base, v_last[k], v_now, v_hashes);
            base_offset := v_base;
            -- Rounded up: a cache that expires hashes by this time never
            -- expires one before SQL would.
            created_ms := ceil(extract(epoch FROM v_now) * 1000)::bigint;
        END IF;
        RETURN NEXT;
        v_msg := v_msg + v_count;
    END LOOP;
END
$$;

------------------------------------------------------------------------------
-- Configure
------------------------------------------------------------------------------

-- The options a queue is created with, camelCase as Queen's clients send
-- them: stile's two (dedupWindowSeconds, retentionSeconds) and Queen's.
CREATE OR REPLACE FUNCTION stile.option_defaults()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{"dedupWindowSeconds": 3600, "retentionSeconds": 0, "leaseTime": 300,
             "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0,
             "maxSize": 10000, "completedRetentionSeconds": 0, "encryptionEnabled": false,
             "namespace": null, "task": null}'::jsonb
$$;

-- A queue row's stored options, as stile.configure returns them.
CREATE OR REPLACE FUNCTION stile.queue_options(q stile.queues)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'dedupWindowSeconds', q.dedup_window_seconds,
        'retentionSeconds', q.retention_seconds,
        'leaseTime', q.lease_time,
        'retryLimit', q.retry_limit,
        'priority', q.priority,
        'delayedProcessing', q.delayed_processing,
        'windowBuffer', q.window_buffer,
        'maxSize', q.max_size,
        'completedRetentionSeconds', q.completed_retention_seconds,
        'encryptionEnabled', q.encryption_enabled,
        'namespace', q.namespace,
        'task', q.task)
$$;

-- Checks one option and returns the value to store: the key's default for a
-- JSON null, integers normalised (5.0 -> 5). Refuses, naming the key in the
-- message and in the error's COLUMN field, an unknown key or a bad value.
CREATE OR REPLACE FUNCTION stile.check_option(p_key text, p_value jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_defaults jsonb := stile.option_defaults();
    v_type text := jsonb_typeof(p_value);
    v_num numeric;
BEGIN
    IF NOT v_defaults ? p_key THEN
        RAISE EXCEPTION '%: unknown option (known: %)', p_key,
                (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(v_defaults) AS k)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    IF p_value IS NULL OR v_type = 'null' THEN
        RETURN v_defaults -> p_key;
    END IF;
    IF p_key = 'encryptionEnabled' THEN
        IF v_type <> 'boolean' THEN
            RAISE EXCEPTION '%: must be a boolean, got %', p_key, p_value
                USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
        END IF;
        RETURN p_value;
    END IF;
    IF p_key IN ('namespace', 'task') THEN
        IF v_type <> 'string' THEN
            RAISE EXCEPTION '%: must be a string or null, got %', p_key, p_value
                USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
        END IF;
        RETURN p_value;
    END IF;
    -- Every other option is a whole number of seconds or a count.
    IF v_type <> 'number' THEN
        RAISE EXCEPTION '%: must be an integer, got %', p_key, p_value
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    v_num := p_value::numeric;
    IF v_num <> trunc(v_num) OR v_num > 2147483647 OR v_num < -2147483648 THEN
        RAISE EXCEPTION '%: must be an integer between -2147483648 and 2147483647, got %', p_key, p_value
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    IF v_num < 0 AND p_key <> 'priority' THEN
        RAISE EXCEPTION '%: must not be negative, got %', p_key, p_value
            USING ERRCODE = 'invalid_parameter_value', COLUMN = p_key;
    END IF;
    RETURN to_jsonb(v_num::integer);
END
$$;

-- Configures a queue and returns its stored options. A new queue starts from
-- the defaults. Merge (p_replace false) leaves omitted keys alone; replace
-- resets every omitted key to its default; in both, an explicit JSON null
-- restores that key's default. Every key is checked before anything is
-- written, and one bad key refuses the whole call.
CREATE OR REPLACE FUNCTION stile.configure(p_queue text, p_options jsonb, p_replace boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_given jsonb := '{}';
    v_key text;
    v_value jsonb;
    v_row stile.queues;
    v_new jsonb;
BEGIN
    IF p_options IS NOT NULL AND jsonb_typeof(p_options) <> 'object' THEN
        RAISE EXCEPTION 'options: must be a JSON object, got %', jsonb_typeof(p_options)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'options';
    END IF;
    FOR v_key, v_value IN SELECT e.key, e.value FROM jsonb_each(coalesce(p_options, '{}')) AS e LOOP
        v_given := v_given || jsonb_build_object(v_key, stile.check_option(v_key, v_value));
    END LOOP;

    INSERT INTO stile.queues (name) VALUES (p_queue) ON CONFLICT DO NOTHING;
    SELECT * INTO STRICT v_row FROM stile.queues WHERE name = p_queue FOR NO KEY UPDATE;
    IF coalesce(p_replace, false) THEN
        v_new := stile.option_defaults() || v_given;
    ELSE
        v_new := stile.queue_options(v_row) || v_given;
    END IF;
    UPDATE stile.queues
       SET dedup_window_seconds = (v_new ->> 'dedupWindowSeconds')::integer,
           retention_seconds = (v_new ->> 'retentionSeconds')::integer,
           lease_time = (v_new ->> 'leaseTime')::integer,
           retry_limit = (v_new ->> 'retryLimit')::integer,
           priority = (v_new ->> 'priority')::integer,
           delayed_processing = (v_new ->> 'delayedProcessing')::integer,
           window_buffer = (v_new ->> 'windowBuffer')::integer,
           max_size = (v_new ->> 'maxSize')::integer,
           completed_retention_seconds = (v_new ->> 'completedRetentionSeconds')::integer,
           encryption_enabled = (v_new ->> 'encryptionEnabled')::boolean,
           namespace = v_new ->> 'namespace',
           task = v_new ->> 'task',
           updated_at = now()
     WHERE name = p_queue
    RETURNING stile.queue_options(queues.*) INTO v_new;
    RETURN v_new;
END
$$;

------------------------------------------------------------------------------
-- Reads
------------------------------------------------------------------------------

-- Messages of a partition from an offset on, in offset order, at most p_limit.
-- created_ms is the segment's created_at in ms since the epoch, rounded up
-- (the same value stile.push returned for it).
CREATE OR REPLACE FUNCTION stile.read_messages(p_queue text, p_partition text, p_from bigint, p_limit integer)
RETURNS TABLE (
    "offset" bigint,
    message_id uuid,
    transaction_id text,
    payload json,
    created_ms bigint
)
LANGUAGE sql STABLE
AS $$
    WITH part AS (
        SELECT p.id FROM stile.partitions p WHERE p.queue = p_queue AND p.name = p_partition
    ), start AS (
        -- the segment holding p_from, or the first one after it
        SELECT part.id,
               coalesce((SELECT max(s.base_offset) FROM stile.segments s
                          WHERE s.partition_id = part.id AND s.base_offset <= p_from),
                        p_from) AS base
          FROM part
    )
    SELECT s.base_offset + m.i - 1, m.id, m.txn, m.payload,
           ceil(extract(epoch FROM s.created_at) * 1000)::bigint
      FROM start
      JOIN stile.segments s ON s.partition_id = start.id AND s.base_offset >= start.base
     CROSS JOIN LATERAL ROWS FROM (unnest(s.message_ids),
                                  unnest(s.transaction_ids),
                                  unnest(s.payloads))
                  WITH ORDINALITY AS m(id, txn, payload, i)
     WHERE s.base_offset + m.i - 1 >= p_from
     ORDER BY s.base_offset, m.i
     LIMIT greatest(p_limit, 0)
$$;

-- Every stored message, a row each: for programs that read the log with plain
-- SQL. Filter on queue and partition (and "offset"), as stile.read_messages
-- does; created_at is the commit time of the message's segment.
CREATE OR REPLACE VIEW stile.messages AS
    SELECT p.queue, p.name AS partition, s.base_offset + m.i - 1 AS "offset",
           m.id AS message_id, m.txn AS transaction_id, m.payload, s.created_at
      FROM stile.segments s
      JOIN stile.partitions p ON p.id = s.partition_id
     CROSS JOIN LATERAL ROWS FROM (unnest(s.message_ids),
                                  unnest(s.transaction_ids),
                                  unnest(s.payloads))
                  WITH ORDINALITY AS m(id, txn, payload, i);

-- The newest stored message of a partition whose transactionId is p_txn.
-- p_hash is its 16-byte hash: txns rows are searched newest first for it,
-- and the stored transactionId is compared to rule out a hash collision.
CREATE OR REPLACE FUNCTION stile.message_by_transaction_id(p_queue text, p_partition text, p_hash bytea, p_txn text)
RETURNS TABLE (
    "offset" bigint,
    message_id uuid,
    transaction_id text,
    payload json,
    created_ms bigint
)
LANGUAGE plpgsql STABLE
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_pid bigint;
    v_base bigint;
    v_hashes bytea;
    v_idx integer;
    v_off bigint;
BEGIN
    SELECT p.id INTO v_pid FROM stile.partitions p WHERE p.queue = p_queue AND p.name = p_partition;
    IF NOT FOUND OR length(p_hash) <> 16 THEN
        RETURN;
    END IF;
    FOR v_base, v_hashes IN
        SELECT t.base_offset, t.hashes FROM stile.txns t
         WHERE t.partition_id = v_pid
           AND position(p_hash IN t.hashes) > 0  -- preselects; the aligned match below decides
         ORDER BY t.base_offset DESC
    LOOP
        FOR v_idx IN
            SELECT u.idx FROM stile.unnest_hashes(v_hashes) AS u WHERE u.h = p_hash ORDER BY u.idx DESC
        LOOP
            v_off := v_base + v_idx;
            RETURN QUERY
                SELECT v_off, s.message_ids[k], s.transaction_ids[k], s.payloads[k],
                       ceil(extract(epoch FROM s.created_at) * 1000)::bigint
                  FROM (SELECT * FROM stile.segments s0
                         WHERE s0.partition_id = v_pid AND s0.base_offset <= v_off
                         ORDER BY s0.base_offset DESC
                         LIMIT 1) AS s
                 CROSS JOIN LATERAL (SELECT (v_off - s.base_offset + 1)::integer AS k) AS kk
                 WHERE s.end_offset >= v_off AND s.transaction_ids[k] = p_txn;
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

------------------------------------------------------------------------------
-- Hydration
------------------------------------------------------------------------------

-- A partition's allocator and purge watermark with its txns rows created in
-- the last p_window_seconds + p_slack_ms (the cache's skew slack: extra old
-- rows only widen its coverage), in one statement and so one snapshot, and
-- clock_ms, the clock_timestamp() the cutoff was taken from, in ms since the
-- epoch, rounded down (a reading of this database's clock). An empty window
-- yields one row whose txns columns are NULL; an unknown partition yields no
-- row. created_ms is rounded up, like stile.push's.
CREATE OR REPLACE FUNCTION stile.hydration(p_partition_id bigint, p_window_seconds integer, p_slack_ms integer)
RETURNS TABLE (
    last_offset bigint,
    txns_start bigint,
    base_offset bigint,
    end_offset bigint,
    created_ms bigint,
    hashes bytea,
    clock_ms bigint
)
LANGUAGE sql STABLE
SET jit = off  -- an index range scan: compiling it would cost more than it saves
AS $$
    WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
    SELECT p.last_offset, p.txns_start, t.base_offset, t.end_offset,
           ceil(extract(epoch FROM t.created_at) * 1000)::bigint, t.hashes,
           floor(extract(epoch FROM clock.now) * 1000)::bigint
      FROM clock
      JOIN stile.partitions p ON p.id = p_partition_id
      LEFT JOIN stile.txns t
        ON t.partition_id = p.id
       AND t.created_at >= clock.now - make_interval(secs => greatest(p_window_seconds, 0))
                                    - make_interval(secs => greatest(p_slack_ms, 0) / 1000.0)
     ORDER BY t.base_offset
$$;

------------------------------------------------------------------------------
-- Retention
------------------------------------------------------------------------------

-- Partitions whose queue has a retention, in id order.
CREATE OR REPLACE FUNCTION stile.purge_candidates()
RETURNS SETOF bigint
LANGUAGE sql STABLE
AS $$
    SELECT p.id FROM stile.partitions p JOIN stile.queues q ON q.name = p.queue
     WHERE q.retention_seconds > 0
     ORDER BY p.id
$$;

-- Applies its queue's retention to one partition, under its row lock.
--   retention_seconds = 0: keeps everything (txns too: lookup by
--     transactionId resolves through them, for as long as the messages live).
--   retention_seconds > 0: deletes the segments older than the retention, and
--     the txns rows older than max(retention, window) -- never a row inside
--     the window -- then raises txns_start past them.
-- Both deletions remove a prefix in offset order (everything below the first
-- row still to keep), so txns_start stays exact even if the clock stepped.
CREATE OR REPLACE FUNCTION stile.purge_partition(
    p_partition_id bigint,
    OUT segments_deleted bigint,
    OUT txns_deleted bigint,
    OUT txns_start bigint
)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_last bigint;
    v_start bigint;
    v_retention integer;
    v_window integer;
    v_now timestamptz;
    v_keep bigint;
BEGIN
    segments_deleted := 0;
    txns_deleted := 0;
    SELECT p.last_offset, p.txns_start, q.retention_seconds, q.dedup_window_seconds
      INTO v_last, v_start, v_retention, v_window
      FROM stile.partitions p
      JOIN stile.queues q ON q.name = p.queue
     WHERE p.id = p_partition_id
       FOR UPDATE OF p;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    txns_start := v_start;
    IF v_retention = 0 THEN
        RETURN;
    END IF;
    v_now := clock_timestamp();

    SELECT s.base_offset INTO v_keep
      FROM stile.segments s
     WHERE s.partition_id = p_partition_id
       AND s.created_at >= v_now - make_interval(secs => v_retention)
     ORDER BY s.base_offset
     LIMIT 1;
    DELETE FROM stile.segments s
     WHERE s.partition_id = p_partition_id AND s.base_offset < coalesce(v_keep, v_last + 1);
    GET DIAGNOSTICS segments_deleted = ROW_COUNT;

    SELECT t.base_offset INTO v_keep
      FROM stile.txns t
     WHERE t.partition_id = p_partition_id
       AND t.created_at >= v_now - make_interval(secs => greatest(v_retention, v_window))
     ORDER BY t.base_offset
     LIMIT 1;
    v_keep := coalesce(v_keep, v_last + 1);
    IF v_keep > v_start THEN
        DELETE FROM stile.txns t WHERE t.partition_id = p_partition_id AND t.base_offset < v_keep;
        GET DIAGNOSTICS txns_deleted = ROW_COUNT;
        UPDATE stile.partitions SET txns_start = v_keep WHERE id = p_partition_id;
        txns_start := v_keep;
    END IF;
END
$$;
