-- The functions the gateway calls, one file per concern in host/sql/functions/
-- (partitions, push, configure, reads, retention, kv, timers), applied in that
-- order after the versioned migrations of host/sql/migrations/.
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

-- The id of the partition p_partition of p_queue, or NULL when there is none:
-- the readers' lookup (they create nothing). PL/pgSQL, like the readers, for
-- a distributed database (see reads.sql).
CREATE OR REPLACE FUNCTION stile.partition_named(p_queue text, p_partition text)
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT p.id FROM stile.partitions p WHERE p.queue = p_queue AND p.name = p_partition);
END
$$;

-- Returns a partition's id, its queue's dedup window (the partition row's
-- copy, see host/sql/migrations/0005_partition_window.sql), its allocator and
-- its purge watermark, creating the queue (from defaults) and the partition
-- on first use. Race-safe: INSERT ... ON CONFLICT DO NOTHING waits for a
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
    SELECT p.id, p.dedup_window_seconds, p.last_offset, p.txns_start
      INTO partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
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
    SELECT p.id, p.dedup_window_seconds, p.last_offset, p.txns_start
      INTO STRICT partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
     WHERE p.queue = p_queue AND p.name = p_partition;
END
$$;

