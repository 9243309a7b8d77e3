-- stile schema, version 6: each timer's payload size, kept by PostgreSQL.
--
-- The firer bounds a batch by the bytes of its payloads as well as by their
-- count (stile.timers_take_due in host/sql/functions/timers.sql): a batch of
-- large timers would otherwise build a message PostgreSQL refuses (1 GB) or
-- hold the gateway's memory, and a batch that cannot be sent is retried
-- forever, stopping every queue's timers. Measuring a payload when the batch
-- is chosen would read (and decompress) every candidate's payload, so the
-- size is computed once, when the row is written, whoever writes it.
ALTER TABLE stile.timers
    ADD COLUMN payload_bytes integer GENERATED ALWAYS AS (octet_length(payload::text)) STORED;
