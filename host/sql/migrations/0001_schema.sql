-- stile schema, version 1: queues, partitions, segments, txns.
--
-- Applied by `stile::db::Db::migrate` inside one transaction, under the
-- migration advisory lock, after the runner has created the schema `stile`
-- and its `stile.schema_migrations` table.

-- One row per queue. `dedup_window_seconds` defaults to one hour and only an
-- explicit 0 disables deduplication; `retention_seconds` 0 keeps messages
-- forever. The remaining columns are Queen's queue options, stored and echoed
-- back by `stile.configure` (stile itself does not act on them).
CREATE TABLE stile.queues (
    name                        text        PRIMARY KEY
                                CHECK (name <> '' AND octet_length(name) <= 255 AND name !~ '[[:cntrl:]]'),
    dedup_window_seconds        integer     NOT NULL DEFAULT 3600 CHECK (dedup_window_seconds >= 0),
    retention_seconds           integer     NOT NULL DEFAULT 0    CHECK (retention_seconds >= 0),
    lease_time                  integer     NOT NULL DEFAULT 300  CHECK (lease_time >= 0),
    retry_limit                 integer     NOT NULL DEFAULT 3    CHECK (retry_limit >= 0),
    priority                    integer     NOT NULL DEFAULT 0,
    delayed_processing          integer     NOT NULL DEFAULT 0    CHECK (delayed_processing >= 0),
    window_buffer               integer     NOT NULL DEFAULT 0    CHECK (window_buffer >= 0),
    max_size                    integer     NOT NULL DEFAULT 10000 CHECK (max_size >= 0),
    completed_retention_seconds integer     NOT NULL DEFAULT 0    CHECK (completed_retention_seconds >= 0),
    encryption_enabled          boolean     NOT NULL DEFAULT false,
    namespace                   text,
    task                        text,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);

-- One row per partition. Its row lock is the partition's write serializer:
-- every push, purge and future ack takes it with SELECT ... FOR UPDATE, several
-- at once only in ascending id order (the one global lock order).
--   last_offset: the allocator; the last offset handed out, -1 while empty.
--   txns_start:  the purge watermark; offsets below it have no txns row.
CREATE TABLE stile.partitions (
    id          bigserial   PRIMARY KEY,
    queue       text        NOT NULL REFERENCES stile.queues (name) ON DELETE CASCADE,
    name        text        NOT NULL,  -- checked by stile.resolve_partition (a CHECK
                                       -- would run on every allocator update)
    last_offset bigint      NOT NULL DEFAULT -1,
    txns_start  bigint      NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue, name)
) WITH (fillfactor = 50);  -- room for HOT updates of the allocator

-- One row per committed segment: offsets base_offset ..= end_offset, and the
-- messages' ids, transactionIds and payloads, in offset order. Payloads are
-- `json`, not `jsonb`: stored exactly as sent (key order, spacing, duplicate
-- keys), and only validated on the way in, which costs a fraction of
-- building a jsonb value (measured: jsonb parsing was half of a 100-message
-- push).
-- segments and txns carry no foreign key to partitions and no CHECK on
-- purpose: their rows are written only by stile.push, under the partition row
-- lock, after it has checked the shapes itself; an RI trigger or a constraint
-- evaluated per insert would cost more than the rest of an uncontended push.
-- (txns rows hold exactly 16 bytes per offset of base_offset ..= end_offset.)
CREATE TABLE stile.segments (
    partition_id    bigint      NOT NULL,
    base_offset     bigint      NOT NULL,
    end_offset      bigint      NOT NULL,
    created_at      timestamptz NOT NULL,
    message_ids     uuid[]      NOT NULL,
    transaction_ids text[]      NOT NULL,
    payloads        json[]      NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
) WITH (toast_tuple_target = 8160);  -- compress or move out of line only past a page
-- No index on created_at: retention deletes a prefix found in primary-key
-- order (see stile.purge_partition), so every push writes one index entry.

-- The dedup sidecar: one row per committed segment, written on every push
-- (even with the window at 0, because lookup by transactionId resolves
-- through it). `hashes` holds 16 bytes per message, in offset order: the
-- xxh3-128 of the transactionId, big-endian, computed by the gateway.
CREATE TABLE stile.txns (
    partition_id bigint      NOT NULL,
    base_offset  bigint      NOT NULL,
    end_offset   bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    hashes       bytea       NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
) WITH (toast_tuple_target = 8160);  -- up to ~500 hashes stay inline
CREATE INDEX txns_end_offset ON stile.txns (partition_id, end_offset);
CREATE INDEX txns_created_at ON stile.txns (partition_id, created_at);

-- Hashes are random bytes: never try to compress them.
ALTER TABLE stile.txns ALTER COLUMN hashes SET STORAGE EXTERNAL;

-- Segments compress well and often exceed the TOAST threshold: prefer lz4
-- where the server was built with it (pglz costs several times more CPU).
DO $$
BEGIN
    ALTER TABLE stile.segments ALTER COLUMN payloads SET COMPRESSION lz4;
    ALTER TABLE stile.segments ALTER COLUMN transaction_ids SET COMPRESSION lz4;
    ALTER TABLE stile.segments ALTER COLUMN message_ids SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: segments keep the default TOAST compression';
END
$$;

-- Splits a txns `hashes` value into its 16-byte hashes, idx from 0.
-- LANGUAGE sql, not STRICT, no SET clause: the planner inlines it.
CREATE FUNCTION stile.unnest_hashes(p_hashes bytea)
RETURNS TABLE (idx integer, h bytea)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT i, substring(p_hashes FROM i * 16 + 1 FOR 16)
    FROM generate_series(0, length(p_hashes) / 16 - 1) AS i
$$;
