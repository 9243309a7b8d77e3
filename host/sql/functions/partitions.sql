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
    RETURN (SELECT n.id FROM stile.partition_names n WHERE n.queue = p_queue AND n.name = p_partition);
END
$$;

-- Serialises a change of a queue's window (p_exclusive: stile.configure)
-- with the creations of the queue's partitions (shared:
-- stile.resolve_partition), until the transaction ends. An advisory lock of
-- the node both run on, not the queue's row: on Citus a row lock of a
-- reference table is taken on every node, and a burst of creations met
-- deadlocks among those.
CREATE OR REPLACE FUNCTION stile.queue_window_lock(p_queue text, p_exclusive boolean)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    -- 0x73746c71: this lock's class ("stlq"), the second key the queue's.
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(1937009777, hashtext(p_queue));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1937009777, hashtext(p_queue));
    END IF;
END
$$;

-- Returns a partition's id, its queue's dedup window (the partition row's
-- copy), its allocator and its purge watermark, creating the queue (from
-- defaults) and the partition on first use.
--
-- A name is claimed in stile.partition_names, whose key is the queue and the
-- name: INSERT ... ON CONFLICT DO NOTHING waits for a concurrent creator, and
-- the lookup after it (a new snapshot) sees the creator's partition, which
-- commits with the name. The partition's id comes from the id column's own
-- sequence, drawn where this function runs (the coordinator, when the tables
-- are distributed).
--
-- The new partition copies its queue's window, read under the queue's window
-- lock (shared): a configure holds that lock (exclusive) until it commits,
-- and copies the window to every partition of the queue it finds (see
-- configure.sql), so a creation beside it either reads the window it commits
-- or is found by it. A copy shorter than the queue's window would let an
-- in-window duplicate through.
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
DECLARE
    v_id bigint;
    v_window integer;
    v_orphan bigint;
BEGIN
    v_id := stile.partition_named(p_queue, p_partition);
    IF v_id IS NULL THEN
        IF p_partition IS NULL OR p_partition = '' OR octet_length(p_partition) > 255
           OR p_partition ~ '[[:cntrl:]]' THEN
            RAISE EXCEPTION 'partition: a partition name is 1 to 255 bytes without control characters'
                USING ERRCODE = 'check_violation', COLUMN = 'partition';
        END IF;
        -- A queue that exists is not written: on Citus a write of the
        -- reference table reaches every node.
        IF NOT EXISTS (SELECT 1 FROM stile.queues q WHERE q.name = p_queue) THEN
            INSERT INTO stile.queues (name) VALUES (p_queue) ON CONFLICT DO NOTHING;
        END IF;
        -- The queue's window lock (shared) before the name: configure takes
        -- it (exclusive) before the partitions too, so that no two of them
        -- wait for each other.
        PERFORM stile.queue_window_lock(p_queue, false);
        SELECT q.dedup_window_seconds INTO STRICT v_window
          FROM stile.queues q
         WHERE q.name = p_queue;
        INSERT INTO stile.partition_names (queue, name, id)
        VALUES (p_queue, p_partition, nextval(pg_get_serial_sequence('stile.partitions', 'id')))
        ON CONFLICT DO NOTHING
        RETURNING id INTO v_id;
        IF v_id IS NOT NULL THEN
            INSERT INTO stile.partitions (id, queue, name, dedup_window_seconds)
            VALUES (v_id, p_queue, p_partition, v_window);
        ELSE
            v_id := stile.partition_named(p_queue, p_partition);
        END IF;
    END IF;
    SELECT p.id, p.dedup_window_seconds, p.last_offset, p.txns_start
      INTO partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
     WHERE p.id = v_id;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Named, but its row not seen yet: on Citus the name and the partition
    -- may lie on two nodes, whose commits of the creating transaction show
    -- one after the other. Inserting the id waits for the creator and then
    -- conflicts; an insert that does not conflict finds a name without a
    -- partition, and fails (taking the insert back) rather than make one
    -- whose log may exist.
    INSERT INTO stile.partitions (id, queue, name, dedup_window_seconds)
    VALUES (v_id, p_queue, p_partition, 0)
    ON CONFLICT (id) DO NOTHING
    RETURNING id INTO v_orphan;
    IF v_orphan IS NOT NULL THEN
        RAISE EXCEPTION 'partition: % of queue % is named (id %) but has no row', p_partition, p_queue, v_id
            USING ERRCODE = 'data_corrupted';
    END IF;
    SELECT p.id, p.dedup_window_seconds, p.last_offset, p.txns_start
      INTO STRICT partition_id, window_seconds, last_offset, txns_start
      FROM stile.partitions p
     WHERE p.id = v_id;
END
$$;


-- Which of p_ids have their row locked by another session right now: those
-- FOR UPDATE SKIP LOCKED passes over. Each row is tried by a statement of
-- its own, in ascending id order (one shard per statement when the table is
-- distributed); the rows it locks are let go when the caller's transaction
-- ends.
CREATE OR REPLACE FUNCTION stile.partitions_locked_elsewhere(p_ids bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT DISTINCT u.id FROM unnest(p_ids) AS u(id) ORDER BY u.id LOOP
        PERFORM 1 FROM stile.partitions p WHERE p.id = v_id FOR UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM stile.partitions p WHERE p.id = v_id) THEN
            RETURN NEXT v_id;
        END IF;
    END LOOP;
END
$$;
