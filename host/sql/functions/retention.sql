------------------------------------------------------------------------------
-- Retention
------------------------------------------------------------------------------

-- Partitions whose queue has a retention, in id order.
CREATE OR REPLACE FUNCTION stile.purge_candidates()
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN QUERY
        SELECT p.id FROM stile.partitions p JOIN stile.queues q ON q.name = p.queue
         WHERE q.retention_seconds > 0
         ORDER BY p.id;
END
$$;

-- Applies its queue's retention to one partition, under its row lock.
--   retention_seconds = 0: keeps everything (hashes too: lookup by
--     transactionId resolves through them, for as long as the messages live).
--   retention_seconds > 0: removes the messages of the log rows older than
--     the retention (their hashes stay while the window holds them), and
--     deletes the rows older than max(retention, window) -- never a row
--     inside the window -- then raises txns_start past them.
-- Both remove a prefix in offset order (everything below the first row still
-- to keep), so the watermarks stay exact even if the clock stepped.
-- segments_deleted counts the rows whose messages were removed, txns_deleted
-- the rows deleted.
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
    v_messages_start bigint;
    v_retention integer;
    v_window integer;
    v_now timestamptz;
    v_keep bigint;
BEGIN
    segments_deleted := 0;
    txns_deleted := 0;
    SELECT p.last_offset, p.txns_start, p.messages_start, q.retention_seconds, q.dedup_window_seconds
      INTO v_last, v_start, v_messages_start, v_retention, v_window
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
      FROM stile.log s
     WHERE s.partition_id = p_partition_id
       AND s.end_offset >= v_messages_start
       AND s.created_at >= v_now - make_interval(secs => v_retention)
     ORDER BY s.end_offset
     LIMIT 1;
    v_keep := coalesce(v_keep, v_last + 1);
    IF v_keep > v_messages_start THEN
        UPDATE stile.log s
           SET message_ids = NULL, transaction_ids = NULL, payloads = NULL
         WHERE s.partition_id = p_partition_id
           AND s.end_offset >= v_messages_start
           AND s.end_offset < v_keep
           AND s.message_ids IS NOT NULL;
        GET DIAGNOSTICS segments_deleted = ROW_COUNT;
        UPDATE stile.partitions SET messages_start = v_keep WHERE id = p_partition_id;
    END IF;

    SELECT s.base_offset INTO v_keep
      FROM stile.log s
     WHERE s.partition_id = p_partition_id
       AND s.end_offset >= v_start
       AND s.created_at >= v_now - make_interval(secs => greatest(v_retention, v_window))
     ORDER BY s.end_offset
     LIMIT 1;
    v_keep := coalesce(v_keep, v_last + 1);
    IF v_keep > v_start THEN
        DELETE FROM stile.log s WHERE s.partition_id = p_partition_id AND s.end_offset < v_keep;
        GET DIAGNOSTICS txns_deleted = ROW_COUNT;
        UPDATE stile.partitions SET txns_start = v_keep WHERE id = p_partition_id;
        txns_start := v_keep;
    END IF;
END
$$;
