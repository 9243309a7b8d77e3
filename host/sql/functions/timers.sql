------------------------------------------------------------------------------
-- Timers (applied with the other functions, see host/src/db/migrate.rs)
------------------------------------------------------------------------------

-- A timer as the API shows it. Times are ms since the epoch. It takes the
-- columns, not a row of stile.timers: a distributed database (Citus) cannot
-- call a function taking a distributed table's row type on its nodes.
CREATE OR REPLACE FUNCTION stile.timer_json(
    p_queue text,
    p_timer_key text,
    p_partition text,
    p_txn text,
    p_message_id uuid,
    p_deliver_at timestamptz,
    p_scheduled_at timestamptz
)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT jsonb_build_object(
        'queue', p_queue, 'timerKey', p_timer_key, 'partition', p_partition, 'txn', p_txn,
        'messageId', p_message_id,
        'deliverAt', floor(extract(epoch FROM p_deliver_at) * 1000)::bigint,
        'scheduledAt', floor(extract(epoch FROM p_scheduled_at) * 1000)::bigint)
$$;

-- Applies timer operations in the caller's transaction; answers one result per
-- operation, in the operations' order. Operations arrive validated and
-- normalised by the gateway (host/src/timers/): schedule and reschedule (one
-- upsert on queue and key, with the message id the gateway minted), and cancel.
--
-- They are applied in the order of their queue and key (a key's own in their
-- order), so that every caller takes timer rows in one order: two calls naming
-- the same keys in other orders wait for each other instead of deadlocking.
-- The firer takes timer rows before partition rows and skips those held, so
-- callers that also push take their timer rows first (host/src/transaction/mod.rs).
CREATE OR REPLACE FUNCTION stile.timers_apply(p_ops jsonb)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_results jsonb := '[]'::jsonb;
    v_op jsonb;
    i integer;
    v_row stile.timers;
    v_inserted boolean;
BEGIN
    FOR v_op, i IN
        SELECT o.op, o.n - 1 FROM jsonb_array_elements(p_ops) WITH ORDINALITY o(op, n)
         ORDER BY o.op ->> 'queue' COLLATE "C", o.op ->> 'timerKey' COLLATE "C", o.n
    LOOP
        IF v_op ->> 'op' = 'cancel' THEN
            DELETE FROM stile.timers
             WHERE queue = v_op ->> 'queue' AND timer_key = (v_op ->> 'timerKey') COLLATE "C"
            RETURNING * INTO v_row;
            v_results := v_results || jsonb_build_array(CASE WHEN FOUND
                THEN jsonb_build_object('index', i, 'ok', true, 'status', 'cancelled')
                     || stile.timer_json(v_row.queue, v_row.timer_key, v_row.partition, v_row.txn, v_row.message_id,
                                         v_row.deliver_at, v_row.scheduled_at)
                ELSE jsonb_strip_nulls(jsonb_build_object('index', i, 'ok', false, 'status', 'absent',
                        'queue', v_op ->> 'queue', 'timerKey', v_op ->> 'timerKey', 'txn', v_op ->> 'txn')) END);
        ELSE
            INSERT INTO stile.timers AS t (queue, timer_key, partition, txn, message_id, payload, deliver_at, scheduled_at)
            VALUES (v_op ->> 'queue', v_op ->> 'timerKey', v_op ->> 'partition', v_op ->> 'txn',
                    (v_op ->> 'messageId')::uuid, (v_op ->> 'payload')::json,
                    v_now + make_interval(secs => (v_op ->> 'delayMs')::double precision / 1000), v_now)
            ON CONFLICT (queue, timer_key) DO UPDATE
               SET partition = excluded.partition, txn = excluded.txn, message_id = excluded.message_id,
                   payload = excluded.payload, deliver_at = excluded.deliver_at, scheduled_at = excluded.scheduled_at
            RETURNING t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.payload, t.deliver_at, t.scheduled_at,
                      (xmax = 0) INTO v_row.queue, v_row.timer_key, v_row.partition, v_row.txn, v_row.message_id,
                                            v_row.payload, v_row.deliver_at, v_row.scheduled_at, v_inserted;
            v_results := v_results || jsonb_build_array(
                jsonb_build_object('index', i, 'ok', true,
                                   'status', CASE WHEN v_inserted THEN 'scheduled' ELSE 'rescheduled' END)
                || stile.timer_json(v_row.queue, v_row.timer_key, v_row.partition, v_row.txn, v_row.message_id,
                                    v_row.deliver_at, v_row.scheduled_at));
        END IF;
    END LOOP;
    RETURN coalesce((SELECT jsonb_agg(r ORDER BY (r ->> 'index')::integer) FROM jsonb_array_elements(v_results) r), '[]');
END
$$;

-- The due timers the next fire takes, locked for this transaction (rows
-- another firer holds are skipped, so each timer is taken once): at most
-- p_limit of them and, past the first, at most p_max_bytes of payload, so
-- that a batch of large timers never builds a message PostgreSQL refuses nor
-- holds more of the gateway's memory than that. The timers p_skip_* name
-- (by queue, key and message id: ones the firer has set aside after they
-- failed on their own) are left for later.
--
-- Queues take turns: each queue's earliest due timer comes before any
-- queue's second, and so on (earliest due first within a turn), so a queue
-- with many or large due timers delays another queue's timers by at most
-- one batch. The turns are dealt among the 10,000 timers due the longest,
-- which bounds the work of a choice when a backlog builds up.
CREATE OR REPLACE FUNCTION stile.timers_claim_due(
    p_limit integer,
    p_max_bytes bigint,
    p_skip_queues text[],
    p_skip_keys text[],
    p_skip_ids uuid[]
)
RETURNS TABLE (claimed_queue text, claimed_key text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_count integer := 0;
    v_bytes bigint := 0;
    v_size integer;
    c record;
BEGIN
    FOR c IN
        SELECT d.queue, d.timer_key, d.payload_bytes
          FROM (SELECT o.queue, o.timer_key, o.deliver_at, o.payload_bytes,
                       row_number() OVER (PARTITION BY o.queue ORDER BY o.deliver_at, o.timer_key) AS turn
                  FROM (SELECT t.queue, t.timer_key, t.message_id, t.deliver_at, t.payload_bytes
                          FROM stile.timers t
                         WHERE t.deliver_at <= v_now
                         ORDER BY t.deliver_at
                         LIMIT 10000) o
                 WHERE NOT EXISTS (SELECT 1 FROM unnest(p_skip_queues, p_skip_keys, p_skip_ids) s(queue, timer_key, message_id)
                                    WHERE s.queue = o.queue AND s.timer_key = o.timer_key
                                      AND s.message_id = o.message_id)) d
         ORDER BY d.turn, d.deliver_at, d.queue, d.timer_key
    LOOP
        EXIT WHEN v_count >= p_limit;
        -- A timer that would pass the bound waits for a later batch; a
        -- smaller one further on may still fit in this one.
        CONTINUE WHEN v_count > 0 AND v_bytes + c.payload_bytes > p_max_bytes;
        SELECT t.payload_bytes INTO v_size
          FROM stile.timers t
         WHERE t.queue = c.queue AND t.timer_key = c.timer_key AND t.deliver_at <= v_now
           FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        v_count := v_count + 1;
        v_bytes := v_bytes + v_size;
        claimed_queue := c.queue;
        claimed_key := c.timer_key;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Takes the due timers stile.timers_claim_due chooses for this
-- transaction: deletes their rows and answers them. The caller pushes the
-- messages in the same transaction, so a fire either commits both or
-- neither. PL/pgSQL, one DELETE per claimed timer (each names its queue
-- and key: one shard when the table is distributed, where Citus plans
-- neither a LANGUAGE sql function over the table nor a join with a
-- function's rows).
CREATE OR REPLACE FUNCTION stile.timers_take_due(
    p_limit integer,
    p_max_bytes bigint,
    p_skip_queues text[],
    p_skip_keys text[],
    p_skip_ids uuid[]
)
RETURNS TABLE (queue text, timer_key text, partition text, txn text, message_id uuid, payload text)
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
BEGIN
    -- The caller pushes the timers' messages in this transaction, which may
    -- create a queue: Citus refuses to write a reference table after a
    -- parallel read of several shards (this one's choice of due timers) in
    -- one transaction, and reads them one at a time when told so first.
    IF current_setting('citus.version', true) IS NOT NULL THEN
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    FOR c IN SELECT * FROM stile.timers_claim_due(p_limit, p_max_bytes, p_skip_queues, p_skip_keys, p_skip_ids) LOOP
        RETURN QUERY
            DELETE FROM stile.timers t
             WHERE t.queue = c.claimed_queue AND t.timer_key = c.claimed_key
            RETURNING t.queue, t.timer_key::text, t.partition, t.txn, t.message_id, t.payload::text;
    END LOOP;
END
$$;

-- The previous build's signature, for its gateways during an upgrade: up to
-- p_limit due timers, within the same bound of bytes as this build's firer.
CREATE OR REPLACE FUNCTION stile.timers_take_due(p_limit integer)
RETURNS SETOF stile.timers
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM stile.timers_claim_due(p_limit, 4194304, '{}', '{}', '{}') LOOP
        RETURN QUERY
            DELETE FROM stile.timers t
             WHERE t.queue = c.claimed_queue AND t.timer_key = c.claimed_key
            RETURNING t.*;
    END LOOP;
END
$$;

-- Milliseconds until the next timer is due (0 when one is), null when none,
-- leaving out the timers p_skip_* name (see timers_claim_due).
-- (greatest() ignores a NULL argument: the earliest time is tested first, or
-- an empty table would read as a timer due now.)
CREATE OR REPLACE FUNCTION stile.timers_next_due_ms(p_skip_queues text[], p_skip_keys text[], p_skip_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_next timestamptz := (
        SELECT t.deliver_at FROM stile.timers t
         WHERE NOT EXISTS (SELECT 1 FROM unnest(p_skip_queues, p_skip_keys, p_skip_ids) s(queue, timer_key, message_id)
                            WHERE s.queue = t.queue AND s.timer_key = t.timer_key AND s.message_id = t.message_id)
         ORDER BY t.deliver_at
         LIMIT 1);
BEGIN
    IF v_next IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN greatest(0, ceil(extract(epoch FROM v_next - clock_timestamp()) * 1000))::bigint;
END
$$;

-- The same over every timer, the previous build's signature.
CREATE OR REPLACE FUNCTION stile.timers_next_due_ms()
RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT stile.timers_next_due_ms('{}', '{}', '{}')
$$;

-- A page of a queue's pending timers, by key, after p_after: at most p_limit
-- of them, and no more than p_max_bytes of timers as jsonb's text (null: no
-- bound; the gateway's compact JSON of a timer is never longer). A page that
-- ends before every timer after p_after is shown says "truncated": true, and
-- "nextAfter" is the last key it shows, whether p_limit or p_max_bytes ended
-- it. A first timer larger than p_max_bytes is refused under SQLSTATE SK002,
-- naming it. The timers are read one at a time, in key order through the
-- primary key (sorts are off for the call: a sort would read every timer of
-- the page before the first, each with its transactionId of up to 64 KB),
-- and the page stops being built as soon as it is full.
CREATE OR REPLACE FUNCTION stile.timers_list(p_queue text, p_after text, p_limit integer, p_max_bytes bigint)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
DECLARE
    v_rows jsonb[] := '{}';
    v_bytes bigint := 0;
    v_more boolean := false;
    v_last text;
    v_timer record;
    v_json jsonb;
    v_size bigint;
BEGIN
    FOR v_timer IN
        SELECT t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.deliver_at, t.scheduled_at
          FROM stile.timers t
         WHERE t.queue = p_queue AND t.timer_key > coalesce(p_after, '') COLLATE "C"
         ORDER BY t.timer_key LIMIT greatest(p_limit, 0) + 1
    LOOP
        IF cardinality(v_rows) >= p_limit THEN
            v_more := true;
            EXIT;
        END IF;
        v_json := stile.timer_json(v_timer.queue, v_timer.timer_key, v_timer.partition, v_timer.txn,
                                   v_timer.message_id, v_timer.deliver_at, v_timer.scheduled_at);
        -- The timer's text and the comma before it.
        v_size := octet_length(v_json::text) + 1;
        IF v_bytes + v_size > p_max_bytes THEN
            IF v_last IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'SK002',
                    MESSAGE = format('the timer %s is %s bytes, more than the answer limit of %s bytes',
                                     to_jsonb(v_timer.timer_key), v_size - 1, p_max_bytes);
            END IF;
            v_more := true;
            EXIT;
        END IF;
        v_bytes := v_bytes + v_size;
        v_rows := v_rows || v_json;
        v_last := v_timer.timer_key;
    END LOOP;
    RETURN jsonb_build_object('rows', to_jsonb(v_rows), 'truncated', v_more,
                              'nextAfter', CASE WHEN v_more THEN v_last END);
END
$$;

-- stile.timers_list without a bound on its bytes, for gateways of the
-- previous build, which call it. Once none remains, `DROP FUNCTION
-- stile.timers_list(text, text, integer)` retires it.
CREATE OR REPLACE FUNCTION stile.timers_list(p_queue text, p_after text, p_limit integer)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$ SELECT stile.timers_list(p_queue, p_after, p_limit, NULL) $$;
