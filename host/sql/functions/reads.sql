------------------------------------------------------------------------------
-- Reads
------------------------------------------------------------------------------

-- A log row's messages, a row each, idx from 0: for the readers below.
-- Empty for a row whose messages retention removed. LANGUAGE sql, STABLE and
-- not STRICT: the planner inlines it.
CREATE OR REPLACE FUNCTION stile.log_messages(p_message_ids bytea, p_transaction_ids text, p_payloads text)
RETURNS TABLE (idx integer, message_id uuid, transaction_id text, payload json)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (m.n - 1)::integer, stile.message_id_at(p_message_ids, (m.n - 1)::integer), m.txn, m.payload
      FROM ROWS FROM (json_array_elements_text(p_transaction_ids::json),
                      json_array_elements(p_payloads::json)) WITH ORDINALITY AS m(txn, payload, n)
$$;

-- Messages of a partition from an offset on, in offset order: at most p_limit
-- of them, and no more than p_max_bytes of answer (null: no bound), each
-- message counted as the gateway counts it (host/src/db/mod.rs
-- StoredMessage::answer_bytes): its payload's text, six bytes per byte of its
-- transactionId (the most JSON's escaping makes of one) and 128 for its other
-- fields. The message that would cross p_max_bytes ends the page: it comes as
-- a last row without its payload (payload NULL), its answer_bytes saying how
-- large it is, so that the caller can say the page was cut, or, when it is
-- the first, name it. created_ms is the row's created_at in ms since the
-- epoch, rounded up (the same value stile.push returned for it).
--
-- Rows are read as the page needs them: the log rows by the primary key in
-- offset order, through a cursor, and each one's messages in the order they
-- are stored (log_messages numbers them as json_array_elements yields them),
-- so no step gathers more than the page and the log row at hand. Sorts are
-- off for the call: a plan that sorted the log rows would read every row of
-- the partition's tail before the first is returned (spilling to temporary
-- files what does not fit in work_mem), which is what the planner picks when
-- it expects many rows. What is returned is kept by PostgreSQL until the
-- call ends, which is why the bound is applied here and not only by the
-- caller.
--
-- This function and the others here, in retention.sql, kv.sql and timers.sql
-- that read the partitioned tables (log, partitions, kv, timers) are PL/pgSQL
-- rather than LANGUAGE sql: a distributed database (Citus) refuses a LANGUAGE
-- sql function's parameterized query over a distributed table, and PL/pgSQL
-- keeps each statement's plan for the session.
CREATE OR REPLACE FUNCTION stile.read_messages(
    p_queue text,
    p_partition text,
    p_from bigint,
    p_limit integer,
    p_max_bytes bigint
)
RETURNS TABLE (
    "offset" bigint,
    message_id uuid,
    transaction_id text,
    payload json,
    created_ms bigint,
    answer_bytes bigint
)
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    v_pid bigint;
    v_row record;
    v_left integer := greatest(p_limit, 0);
    v_bytes bigint := 0;
BEGIN
    v_pid := stile.partition_named(p_queue, p_partition);
    IF v_pid IS NULL OR v_left = 0 THEN
        RETURN;
    END IF;
    FOR v_row IN
        SELECT s.base_offset, s.message_ids, s.transaction_ids, s.payloads,
               ceil(extract(epoch FROM s.created_at) * 1000)::bigint AS created_ms
          FROM stile.log s
         WHERE s.partition_id = v_pid AND s.end_offset >= p_from AND s.message_ids IS NOT NULL
         ORDER BY s.end_offset
    LOOP
        created_ms := v_row.created_ms;
        FOR "offset", message_id, transaction_id, payload IN
            SELECT v_row.base_offset + m.idx, m.message_id, m.transaction_id, m.payload
              FROM stile.log_messages(v_row.message_ids, v_row.transaction_ids, v_row.payloads) AS m
             WHERE v_row.base_offset + m.idx >= p_from
        LOOP
            answer_bytes := octet_length(payload::text) + 6 * octet_length(transaction_id) + 128;
            v_bytes := v_bytes + answer_bytes;
            IF v_bytes > p_max_bytes THEN
                payload := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
            RETURN NEXT;
            v_left := v_left - 1;
            IF v_left = 0 THEN
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- stile.read_messages without a bound of bytes, and without answer_bytes:
-- for readers with plain SQL (README.md) and for gateways of the previous
-- build, which call it. A LANGUAGE sql wrapper that reads no table itself.
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
    SELECT m."offset", m.message_id, m.transaction_id, m.payload, m.created_ms
      FROM stile.read_messages(p_queue, p_partition, p_from, p_limit, NULL) AS m
$$;

-- Every stored message, a row each: for programs that read the log with plain
-- SQL. Filter on queue and partition (and "offset"), as stile.read_messages
-- does; created_at is the commit time of the message's segment.
CREATE OR REPLACE VIEW stile.messages AS
    SELECT p.queue, p.name AS partition, s.base_offset + m.idx AS "offset",
           m.message_id, m.transaction_id, m.payload, s.created_at
      FROM stile.log s
      JOIN stile.partitions p ON p.id = s.partition_id
     CROSS JOIN LATERAL stile.log_messages(s.message_ids, s.transaction_ids, s.payloads) AS m;

-- The log as two tables, one row per committed segment, with the columns and
-- types the two tables of earlier layouts had: for programs that read them.
-- stile.segments holds the rows whose messages retention has not removed.
CREATE OR REPLACE VIEW stile.segments AS
    SELECT s.partition_id, s.base_offset, s.end_offset, s.created_at,
           ARRAY(SELECT m.message_id FROM stile.log_messages(s.message_ids, s.transaction_ids, s.payloads) AS m
                  ORDER BY m.idx) AS message_ids,
           ARRAY(SELECT json_array_elements_text(s.transaction_ids::json)) AS transaction_ids,
           ARRAY(SELECT json_array_elements(s.payloads::json)) AS payloads
      FROM stile.log s
     WHERE s.message_ids IS NOT NULL;

CREATE OR REPLACE VIEW stile.txns AS
    SELECT s.partition_id, s.base_offset, s.end_offset, s.created_at, s.hashes
      FROM stile.log s;

-- The newest stored message of a partition whose transactionId is p_txn.
-- p_hash is its 16-byte hash: log rows are searched newest first for it, and
-- the stored transactionId is compared to rule out a hash collision. The
-- search reads every row of the partition newer than the message (not only
-- the window's): lookup by transactionId holds for as long as the message is
-- stored.
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
    v_row record;
    v_idx integer;
BEGIN
    v_pid := stile.partition_named(p_queue, p_partition);
    IF v_pid IS NULL OR length(p_hash) <> 16 THEN
        RETURN;
    END IF;
    FOR v_row IN
        SELECT s.base_offset, s.hashes, s.message_ids, s.transaction_ids, s.payloads, s.created_at
          FROM stile.log s
         WHERE s.partition_id = v_pid
           AND s.message_ids IS NOT NULL
           AND position(p_hash IN s.hashes) > 0  -- preselects; the aligned match below decides
         ORDER BY s.end_offset DESC
    LOOP
        FOR v_idx IN
            SELECT u.idx FROM stile.unnest_hashes(v_row.hashes) AS u WHERE u.h = p_hash ORDER BY u.idx DESC
        LOOP
            IF (v_row.transaction_ids::json ->> v_idx) = p_txn THEN
                RETURN QUERY
                    SELECT v_row.base_offset + v_idx, stile.message_id_at(v_row.message_ids, v_idx), p_txn,
                           v_row.payloads::json -> v_idx,
                           ceil(extract(epoch FROM v_row.created_at) * 1000)::bigint;
                RETURN;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

------------------------------------------------------------------------------
-- Hydration
------------------------------------------------------------------------------

-- A partition's allocator and purge watermark with its log rows' hashes
-- created in the last p_window_seconds + p_slack_ms (the cache's skew slack:
-- extra old rows only widen its coverage), in one statement and so one
-- snapshot, and clock_ms, the clock_timestamp() the cutoff was taken from, in
-- ms since the epoch, rounded down (a reading of this database's clock). An
-- empty window yields one row whose row columns are NULL; an unknown
-- partition yields no row. created_ms is rounded up, like stile.push's.
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
LANGUAGE plpgsql STABLE
SET jit = off  -- an index range scan: compiling it would cost more than it saves
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
        SELECT p.last_offset, p.txns_start, t.base_offset, t.end_offset,
               ceil(extract(epoch FROM t.created_at) * 1000)::bigint, t.hashes,
               floor(extract(epoch FROM clock.now) * 1000)::bigint
          FROM clock
          JOIN stile.partitions p ON p.id = p_partition_id
          LEFT JOIN stile.log t
            ON t.partition_id = p.id
           AND t.created_at >= clock.now - make_interval(secs => greatest(p_window_seconds, 0))
                                        - make_interval(secs => greatest(p_slack_ms, 0) / 1000.0)
         ORDER BY t.end_offset;
END
$$;
