-- stile schema, version 3: keys (KV and once) and timers.
--
-- Both are written only by the functions in host/sql/kv.sql and
-- host/sql/timers.sql, inside the caller's transaction, so that a
-- transaction's pushes, keys and timers commit together or not at all.

-- Every applied write takes the next value: a key's version never repeats,
-- even across a delete and a re-create, so `expect: N` cannot match a later
-- incarnation of the key by accident.
CREATE SEQUENCE stile.kv_versions;

-- One row per key. A row whose expires_at has passed is absent to every
-- operation (and overwritten by the next write); stile.kv_purge deletes it
-- later. Keys compare byte by byte ("C"), which is the order getPrefix pages
-- in and what lets its prefix use the primary key.
CREATE TABLE stile.kv (
    ns          text        NOT NULL,
    key         text        COLLATE "C" NOT NULL,
    value       jsonb       NOT NULL,
    version     bigint      NOT NULL,
    expires_at  timestamptz,            -- NULL: forever
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (ns, key)
);
CREATE INDEX kv_expires_at ON stile.kv (expires_at) WHERE expires_at IS NOT NULL;

-- One row per pending timer. A fire deletes the row and pushes its message
-- (transactionId txn, id message_id) in one transaction; a row that is here
-- has not been delivered, and one that is gone is delivered or cancelled.
CREATE TABLE stile.timers (
    queue        text        NOT NULL,
    timer_key    text        COLLATE "C" NOT NULL,
    partition    text        NOT NULL,
    txn          text        NOT NULL,
    message_id   uuid        NOT NULL,
    payload      json        NOT NULL,
    deliver_at   timestamptz NOT NULL,
    scheduled_at timestamptz NOT NULL,
    PRIMARY KEY (queue, timer_key)
);
CREATE INDEX timers_deliver_at ON stile.timers (deliver_at);
