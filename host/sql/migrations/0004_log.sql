-- stile schema, version 4: the log, one row per committed segment holding
-- its hashes and its messages (what segments and txns held in two rows).
--
-- The rows of stile.segments and stile.txns are moved into it in this
-- migration's transaction, then both tables are dropped; views of the same
-- names and columns (host/sql/functions/reads.sql) keep reading them.

-- One row per committed segment: offsets base_offset ..= end_offset of one
-- partition, written only by stile.push, under the partition's row lock,
-- after it has checked the shapes itself (so no foreign key and no CHECK:
-- either would be evaluated on every insert).
--   hashes:          16 bytes per message, in offset order: the xxh3-128 of
--                    the transactionId, big-endian, computed by the gateway.
--                    Kept while the row is inside the window, even once
--                    retention removed the messages.
--   message_ids:     16 bytes per message, the UUIDs' bytes, in offset order.
--   transaction_ids: a JSON array of the transactionIds, in offset order.
--   payloads:        a JSON array of the payloads, in offset order, each the
--                    JSON text the gateway validated, as sent.
-- The three message columns are NULL together once retention removed the
-- messages. transaction_ids and payloads are text, not json: PostgreSQL
-- stores what the gateway sent without parsing it again (the gateway already
-- validated every payload). Readers cast them to json. This rests on one
-- assumption: only a stile gateway calls stile.push.
--
-- The primary key is on end_offset: the row holding offset o is the first at
-- or above it, and a probe's span (end_offset above a bound) is its range.
CREATE TABLE stile.log (
    partition_id    bigint      NOT NULL,
    end_offset      bigint      NOT NULL,
    base_offset     bigint      NOT NULL,
    created_at      timestamptz NOT NULL,
    hashes          bytea       NOT NULL,
    message_ids     bytea,
    transaction_ids text,
    payloads        text,
    PRIMARY KEY (partition_id, end_offset)
) WITH (toast_tuple_target = 8160);  -- compress or move out of line only past a page
-- Hydration reads a partition's rows of the window by creation time, and the
-- time of a row is not ordered by offset (the clock may step back).
CREATE INDEX log_created_at ON stile.log (partition_id, created_at);

-- Hashes and message ids are random bytes: never try to compress them.
ALTER TABLE stile.log ALTER COLUMN hashes SET STORAGE EXTERNAL;
ALTER TABLE stile.log ALTER COLUMN message_ids SET STORAGE EXTERNAL;

-- Payloads compress well: prefer lz4 where the server was built with it
-- (pglz costs several times more CPU).
DO $$
BEGIN
    ALTER TABLE stile.log ALTER COLUMN payloads SET COMPRESSION lz4;
    ALTER TABLE stile.log ALTER COLUMN transaction_ids SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 is not available: the log keeps the default TOAST compression';
END
$$;

-- The offsets below which retention removed the messages (their rows keep
-- only hashes, or are gone): where the next purge resumes.
ALTER TABLE stile.partitions ADD COLUMN messages_start bigint NOT NULL DEFAULT 0;

-- Every txns row becomes a log row; its segment's messages join it when
-- retention has not removed them. (A segment row always had its txns row:
-- retention removed txns rows only past the older of its two bounds.)
INSERT INTO stile.log (partition_id, end_offset, base_offset, created_at, hashes, message_ids, transaction_ids, payloads)
SELECT t.partition_id, t.end_offset, t.base_offset, t.created_at, t.hashes,
       decode(replace(array_to_string(s.message_ids, ''), '-', ''), 'hex'),
       array_to_json(s.transaction_ids)::text,
       array_to_json(s.payloads)::text
  FROM stile.txns t
  LEFT JOIN stile.segments s ON s.partition_id = t.partition_id AND s.base_offset = t.base_offset;

UPDATE stile.partitions p
   SET messages_start = coalesce((SELECT min(s.base_offset) FROM stile.segments s WHERE s.partition_id = p.id),
                                 p.last_offset + 1);

-- The previous build's functions read and write the two tables: dropped with
-- them, and made again by this build's function set right after.
DROP TABLE stile.segments, stile.txns CASCADE;

-- The previous build's function set (its checksum, see host/src/db/migrate.rs)
-- counts as applied: a gateway of that build starting against this database
-- would otherwise put its functions, which read the dropped tables, back
-- over this build's.
INSERT INTO stile.function_sets (checksum) VALUES ('7b80b9dbd398a7db') ON CONFLICT DO NOTHING;
