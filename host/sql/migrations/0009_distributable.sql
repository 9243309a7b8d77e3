-- stile schema, version 9: a layout Citus can distribute (docs/scale-out.md),
-- with the same behaviour on plain PostgreSQL.
--
-- * Partition names resolve through stile.partition_names, keyed by queue and
--   name, instead of a UNIQUE (queue, name) on stile.partitions: a
--   distributed table's unique keys must include its distribution column
--   (the partition id).
-- * No triggers: stile.resolve_partition gives a new partition its queue's
--   window and stile.configure copies the window to the queue's partitions,
--   serialised by a lock per queue (stile.queue_window_lock, see
--   host/sql/functions/partitions.sql and configure.sql). A window written
--   by plain SQL is copied by the next configure.
-- * The key versions' sequence belongs to stile.kv.version and is its
--   default: a sequence used as a column default is made on every node.
-- * The functions taking a table's row type, kept for gateways of two builds
--   before, are dropped.

-- Serialises this migration against queue and partition writers: none
-- commits a window or a partition between the copies below and the
-- functions taking over.
LOCK TABLE stile.queues, stile.partitions IN SHARE MODE;

CREATE TABLE stile.partition_names (
    queue text   NOT NULL,
    name  text   NOT NULL,
    id    bigint NOT NULL,
    PRIMARY KEY (queue, name)
);
INSERT INTO stile.partition_names (queue, name, id)
SELECT p.queue, p.name, p.id FROM stile.partitions p;
ALTER TABLE stile.partitions DROP CONSTRAINT IF EXISTS partitions_queue_name_key;

DROP TRIGGER IF EXISTS partition_takes_queue_window ON stile.partitions;
DROP TRIGGER IF EXISTS queue_window_to_partitions ON stile.queues;
DROP FUNCTION IF EXISTS stile.partition_takes_queue_window();
DROP FUNCTION IF EXISTS stile.queue_window_to_partitions();

ALTER SEQUENCE stile.kv_versions OWNED BY stile.kv.version;
ALTER TABLE stile.kv ALTER COLUMN version SET DEFAULT nextval('stile.kv_versions');

DROP FUNCTION IF EXISTS stile.queue_options(stile.queues);
DROP FUNCTION IF EXISTS stile.timer_row(stile.timers);
